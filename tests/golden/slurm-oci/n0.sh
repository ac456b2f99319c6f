#!/usr/bin/env bash
# epdctl plan for topology slurm-oci (engine embedded), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node n0 =====

# encoder-0: encoder, http://n0.slurm:32400
srun \
    --container=<REPO>/.bundles/epdctl-runtime <REPO>/.venv/bin/python -m epdctl.runtime encoder \
    --model-path <REPO>/models/tiny-qwen2vl \
    --host n0.slurm \
    --port 32400 \
    --transport zmq \
    --transfer-port 32403 \
    --switchable

# router: http://n0.slurm:32401 (metrics on port 32402)
<REPO>/.venv/bin/python -m smg.launch_router \
    --pd-disaggregation \
    --prefill http://n1.slurm:32430 32431 \
    --decode http://n2.slurm:32460 \
    --host n0.slurm \
    --port 32401 \
    --prometheus-host n0.slurm \
    --prometheus-port 32402 \
    --max-payload-size 67108864 \
    --enable-igw \
    --health-check-interval-secs 1 \
    --health-failure-threshold 2 \
    --health-success-threshold 1 \
    --health-check-timeout-secs 5 \
    --worker-startup-check-interval 1 \
    --cb-timeout-duration-secs 2
