#!/usr/bin/env bash
# epdctl plan for topology slurm-by-count (engine embedded), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node prefill-n1 =====

# prefill-1: prefill, http://prefill-n1.slurm:37300
python3 -m epdctl.runtime prefill \
    --model-path <REPO>/models/tiny-qwen2vl \
    --served-model-name tiny-qwen2vl \
    --host prefill-n1.slurm \
    --port 37300 \
    --bootstrap-port 37301 \
    --encoder-bootstrap-port 37302 \
    --encoder-urls http://encoder-n0.slurm:37100 \
    --transport zmq \
    --transfer-port 37303 \
    --switchable
