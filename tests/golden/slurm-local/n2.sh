#!/usr/bin/env bash
# epdctl plan for topology slurm-local (engine embedded), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node n2 =====

# decode-0: decode, http://n2.slurm:37300
python3 -m epdctl.runtime decode \
    --model-path <REPO>/models/tiny-qwen2vl \
    --served-model-name tiny-qwen2vl \
    --host n2.slurm \
    --port 37300 \
    --transport zmq \
    --transfer-port 37301 \
    --switchable
