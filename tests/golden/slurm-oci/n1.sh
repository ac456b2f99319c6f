#!/usr/bin/env bash
# epdctl plan for topology slurm-oci (engine embedded), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node n1 =====

# prefill-0: prefill, http://n1.slurm:32430
srun \
    --container=<REPO>/.bundles/epdctl-runtime <REPO>/.venv/bin/python -m epdctl.runtime prefill \
    --model-path <REPO>/models/tiny-qwen2vl \
    --served-model-name tiny-qwen2vl \
    --host n1.slurm \
    --port 32430 \
    --bootstrap-port 32431 \
    --encoder-bootstrap-port 32432 \
    --encoder-urls http://n0.slurm:32400 \
    --transport zmq \
    --transfer-port 32433 \
    --switchable
