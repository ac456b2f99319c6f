#!/usr/bin/env bash
# epdctl plan for topology deepseek-v3-pp4-ep32 (engine sglang), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node dc2 =====

# decode-0.r2: decode, node rank 2 of 4, GPUs 0,1,2,3,4,5,6,7, http://10.1.0.22:30000 (not registered with the router)
env NCCL_IB_HCA=mlx5_0,mlx5_1,mlx5_2,mlx5_3 \
  python3 -m sglang.launch_server \
    --model-path /models/DeepSeek-V3-0324 \
    --served-model-name deepseek-v3 \
    --host 10.1.0.22 \
    --port 30000 \
    --trust-remote-code \
    --tp-size 32 \
    --attn-dp-size 32 \
    --moe-a2a-backend deepep \
    --base-gpu-id 0 \
    --dist-init-addr 10.1.0.20:30001 \
    --nnodes 4 \
    --node-rank 2 \
    --disaggregation-mode decode \
    --disaggregation-transfer-backend mooncake \
    --disaggregation-ib-device mlx5_0,mlx5_1 \
    --page-size 64 \
    --kv-cache-dtype fp8_e4m3 \
    --max-running-requests 2048 \
    --enable-metrics \
    --deepep-mode low_latency \
    --enable-eplb \
    --ep-num-redundant-experts 32
