#!/usr/bin/env bash
# epdctl plan for topology ssh-3node (engine embedded), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node node-a =====
source ~/epdctl/.venv/bin/activate

# encoder-0: encoder, http://127.0.0.2:35100
python3 -m epdctl.runtime encoder \
    --model-path <REPO>/models/tiny-qwen2vl \
    --host 127.0.0.2 \
    --port 35100 \
    --transport zmq \
    --transfer-port 35103 \
    --switchable

# router: http://127.0.0.2:35101 (metrics on port 35102)
python3 -m smg.launch_router \
    --pd-disaggregation \
    --prefill http://127.0.0.3:35100 35101 \
    --decode http://127.0.0.4:35100 \
    --host 127.0.0.2 \
    --port 35101 \
    --prometheus-host 127.0.0.2 \
    --prometheus-port 35102 \
    --max-payload-size 67108864 \
    --enable-igw \
    --health-check-interval-secs 1 \
    --health-failure-threshold 2 \
    --health-success-threshold 1 \
    --health-check-timeout-secs 5 \
    --worker-startup-check-interval 1 \
    --cb-timeout-duration-secs 2
