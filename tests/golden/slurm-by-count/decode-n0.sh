#!/usr/bin/env bash
# epdctl plan for topology slurm-by-count (engine embedded), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node decode-n0 =====

# decode-0: decode, http://decode-n0.slurm:37400
python3 -m epdctl.runtime decode \
    --model-path <REPO>/models/tiny-qwen2vl \
    --served-model-name tiny-qwen2vl \
    --host decode-n0.slurm \
    --port 37400 \
    --transport zmq \
    --transfer-port 37401 \
    --switchable
