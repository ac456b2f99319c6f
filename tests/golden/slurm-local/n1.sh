#!/usr/bin/env bash
# epdctl plan for topology slurm-local (engine embedded), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node n1 =====

# prefill-0: prefill, http://n1.slurm:37200
python3 -m epdctl.runtime prefill \
    --model-path <REPO>/models/tiny-qwen2vl \
    --served-model-name tiny-qwen2vl \
    --host n1.slurm \
    --port 37200 \
    --bootstrap-port 37201 \
    --encoder-bootstrap-port 37202 \
    --encoder-urls http://n0.slurm:37100 \
    --transport zmq \
    --transfer-port 37203 \
    --switchable
