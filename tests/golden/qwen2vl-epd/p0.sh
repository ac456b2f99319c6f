#!/usr/bin/env bash
# epdctl plan for topology qwen2vl-epd (engine sglang), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node p0 =====
source /opt/sglang/venv/bin/activate

# prefill-0: prefill, GPUs 0,1,2,3, http://10.0.0.11:30000
env SGLANG_ENCODER_MAX_BATCH_SIZE=16 \
  python3 -m sglang.launch_server \
    --model-path /models/Qwen2-VL-7B-Instruct \
    --served-model-name qwen2-vl-7b \
    --host 10.0.0.11 \
    --port 30000 \
    --dtype bfloat16 \
    --tp-size 4 \
    --base-gpu-id 0 \
    --disaggregation-mode prefill \
    --disaggregation-bootstrap-port 30001 \
    --disaggregation-transfer-backend mooncake \
    --disaggregation-ib-device mlx5_0,mlx5_1 \
    --language-only \
    --encoder-urls http://10.0.0.10:30000 http://10.0.0.10:30001 http://10.0.0.10:30002 http://10.0.0.10:30003 http://10.0.0.10:30004 http://10.0.0.10:30005 http://10.0.0.10:30006 http://10.0.0.10:30007 \
    --encoder-bootstrap-port 30002 \
    --chunked-prefill-size 8192 \
    --page-size 64 \
    --enable-metrics

# prefill-1: prefill, GPUs 4,5,6,7, http://10.0.0.11:30003
env SGLANG_ENCODER_MAX_BATCH_SIZE=16 \
  python3 -m sglang.launch_server \
    --model-path /models/Qwen2-VL-7B-Instruct \
    --served-model-name qwen2-vl-7b \
    --host 10.0.0.11 \
    --port 30003 \
    --dtype bfloat16 \
    --tp-size 4 \
    --base-gpu-id 4 \
    --disaggregation-mode prefill \
    --disaggregation-bootstrap-port 30004 \
    --disaggregation-transfer-backend mooncake \
    --disaggregation-ib-device mlx5_0,mlx5_1 \
    --language-only \
    --encoder-urls http://10.0.0.10:30000 http://10.0.0.10:30001 http://10.0.0.10:30002 http://10.0.0.10:30003 http://10.0.0.10:30004 http://10.0.0.10:30005 http://10.0.0.10:30006 http://10.0.0.10:30007 \
    --encoder-bootstrap-port 30005 \
    --chunked-prefill-size 8192 \
    --page-size 64 \
    --enable-metrics

# router: http://10.0.0.11:8000 (metrics on port 29000), API key from $EPD_ROUTER_API_KEY
python3 -m epdctl.node.router_exec EPD_ROUTER_API_KEY smg.launch_router \
    --pd-disaggregation \
    --prefill http://10.0.0.11:30000 30001 \
    --prefill http://10.0.0.11:30003 30004 \
    --decode http://10.0.0.12:30000 \
    --decode http://10.0.0.12:30001 \
    --host 10.0.0.11 \
    --port 8000 \
    --prometheus-host 10.0.0.11 \
    --prometheus-port 29000 \
    --policy round_robin \
    --max-payload-size 67108864 \
    --enable-igw \
    --health-check-interval-secs 1 \
    --health-failure-threshold 2 \
    --health-success-threshold 1 \
    --health-check-timeout-secs 5 \
    --worker-startup-check-interval 1 \
    --cb-timeout-duration-secs 2
