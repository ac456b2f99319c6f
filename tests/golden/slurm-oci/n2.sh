#!/usr/bin/env bash
# epdctl plan for topology slurm-oci (engine embedded), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node n2 =====

# decode-0: decode, http://n2.slurm:32460
srun \
    --container=<REPO>/.bundles/epdctl-runtime <REPO>/.venv/bin/python -m epdctl.runtime decode \
    --model-path <REPO>/models/tiny-qwen2vl \
    --served-model-name tiny-qwen2vl \
    --host n2.slurm \
    --port 32460 \
    --transport zmq \
    --transfer-port 32461 \
    --switchable
