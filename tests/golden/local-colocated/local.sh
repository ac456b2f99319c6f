#!/usr/bin/env bash
# epdctl plan for topology local-colocated (engine embedded), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node local =====

# colocated-0: colocated, http://127.0.0.1:31050
python3 -m epdctl.runtime colocated \
    --model-path <REPO>/models/tiny-qwen2vl \
    --served-model-name tiny-qwen2vl \
    --host 127.0.0.1 \
    --port 31050

# router: http://127.0.0.1:31051 (metrics on port 31052)
python3 -m smg.launch_router \
    --worker-urls http://127.0.0.1:31050 \
    --host 127.0.0.1 \
    --port 31051 \
    --prometheus-host 127.0.0.1 \
    --prometheus-port 31052 \
    --max-payload-size 67108864 \
    --health-check-interval-secs 1 \
    --health-failure-threshold 2 \
    --health-success-threshold 1 \
    --health-check-timeout-secs 5 \
    --worker-startup-check-interval 1 \
    --cb-timeout-duration-secs 2
