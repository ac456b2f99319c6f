#!/usr/bin/env bash
# epdctl plan for topology deepseek-v3-pp4-ep32 (engine sglang), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node pf0 =====

# prefill-0: prefill, node rank 0 of 4, GPUs 0,1,2,3,4,5,6,7, http://10.1.0.10:30000
env NCCL_IB_HCA=mlx5_0,mlx5_1,mlx5_2,mlx5_3 \
  python3 -m sglang.launch_server \
    --model-path /models/DeepSeek-V3-0324 \
    --served-model-name deepseek-v3 \
    --host 10.1.0.10 \
    --port 30000 \
    --trust-remote-code \
    --tp-size 8 \
    --pp-size 4 \
    --base-gpu-id 0 \
    --dist-init-addr 10.1.0.10:30002 \
    --nnodes 4 \
    --node-rank 0 \
    --disaggregation-mode prefill \
    --disaggregation-bootstrap-port 30001 \
    --disaggregation-transfer-backend mooncake \
    --disaggregation-ib-device mlx5_0,mlx5_1 \
    --chunked-prefill-size 12288 \
    --page-size 64 \
    --kv-cache-dtype fp8_e4m3 \
    --mem-fraction-static 0.8 \
    --enable-metrics

# router: http://10.1.0.10:8000 (metrics on port 29000), API key from $EPD_ROUTER_API_KEY
python3 -m epdctl.node.router_exec EPD_ROUTER_API_KEY smg.launch_router \
    --pd-disaggregation \
    --prefill http://10.1.0.10:30000 30001 \
    --decode http://10.1.0.20:30000 \
    --host 10.1.0.10 \
    --port 8000 \
    --prometheus-host 10.1.0.10 \
    --prometheus-port 29000 \
    --max-payload-size 67108864 \
    --enable-igw \
    --health-check-interval-secs 1 \
    --health-failure-threshold 2 \
    --health-success-threshold 1 \
    --health-check-timeout-secs 5 \
    --worker-startup-check-interval 1 \
    --cb-timeout-duration-secs 2
