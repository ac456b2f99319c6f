#!/usr/bin/env bash
# epdctl plan for topology qwen2vl-epd (engine sglang), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node d0 =====
source /opt/sglang/venv/bin/activate

# decode-0: decode, GPUs 0,1,2,3, http://10.0.0.12:30000
env SGLANG_ENCODER_MAX_BATCH_SIZE=16 \
  python3 -m sglang.launch_server \
    --model-path /models/Qwen2-VL-7B-Instruct \
    --served-model-name qwen2-vl-7b \
    --host 10.0.0.12 \
    --port 30000 \
    --dtype bfloat16 \
    --tp-size 4 \
    --base-gpu-id 0 \
    --disaggregation-mode decode \
    --disaggregation-transfer-backend mooncake \
    --disaggregation-ib-device mlx5_0,mlx5_1 \
    --page-size 64 \
    --max-running-requests 128 \
    --enable-metrics

# decode-1: decode, GPUs 4,5,6,7, http://10.0.0.12:30001
env SGLANG_ENCODER_MAX_BATCH_SIZE=16 \
  python3 -m sglang.launch_server \
    --model-path /models/Qwen2-VL-7B-Instruct \
    --served-model-name qwen2-vl-7b \
    --host 10.0.0.12 \
    --port 30001 \
    --dtype bfloat16 \
    --tp-size 4 \
    --base-gpu-id 4 \
    --disaggregation-mode decode \
    --disaggregation-transfer-backend mooncake \
    --disaggregation-ib-device mlx5_0,mlx5_1 \
    --page-size 64 \
    --max-running-requests 128 \
    --enable-metrics
