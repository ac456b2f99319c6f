#!/usr/bin/env bash
# epdctl plan for topology sglang-cpu-colocated (engine sglang), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node local =====

# colocated-0: colocated, http://127.0.0.1:31400
env SGLANG_USE_CPU_ENGINE=1 \
  <REPO>/.engines/sglang-cpu/bin/python -m sglang.launch_server \
    --model-path <REPO>/.engines/models/tiny-qwen2vl-sglang \
    --served-model-name tiny-qwen2vl \
    --host 127.0.0.1 \
    --port 31400 \
    --tp-size 1 \
    --device cpu \
    --max-running-requests 4 \
    --enable-metrics \
    --attention-backend torch_native \
    --max-total-tokens 16384 \
    --context-length 4096

# ===== node local =====

# router: http://127.0.0.1:31401 (metrics on port 31402)
python3 -m smg.launch_router \
    --worker-urls http://127.0.0.1:31400 \
    --host 127.0.0.1 \
    --port 31401 \
    --prometheus-host 127.0.0.1 \
    --prometheus-port 31402 \
    --max-payload-size 67108864 \
    --health-check-interval-secs 1 \
    --health-failure-threshold 2 \
    --health-success-threshold 1 \
    --health-check-timeout-secs 5 \
    --worker-startup-check-interval 1 \
    --cb-timeout-duration-secs 2
