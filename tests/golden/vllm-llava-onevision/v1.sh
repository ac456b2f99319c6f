#!/usr/bin/env bash
# epdctl plan for topology vllm-llava-onevision (engine vllm), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node v1 =====

# decode-0: decode, GPUs 0,1,2,3, http://10.2.0.11:30000
env CUDA_VISIBLE_DEVICES=0,1,2,3 UCX_NET_DEVICES=mlx5_2:1 VLLM_NIXL_SIDE_CHANNEL_HOST=10.2.0.11 VLLM_NIXL_SIDE_CHANNEL_PORT=30001 \
  vllm serve /models/llava-onevision-qwen2-7b-ov-hf \
    --served-model-name llava-onevision-7b \
    --host 10.2.0.11 \
    --port 30000 \
    --dtype bfloat16 \
    --tensor-parallel-size 4 \
    --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}' \
    --block-size 16

# decode-1: decode, GPUs 4,5,6,7, http://10.2.0.11:30002
env CUDA_VISIBLE_DEVICES=4,5,6,7 UCX_NET_DEVICES=mlx5_2:1 VLLM_NIXL_SIDE_CHANNEL_HOST=10.2.0.11 VLLM_NIXL_SIDE_CHANNEL_PORT=30003 \
  vllm serve /models/llava-onevision-qwen2-7b-ov-hf \
    --served-model-name llava-onevision-7b \
    --host 10.2.0.11 \
    --port 30002 \
    --dtype bfloat16 \
    --tensor-parallel-size 4 \
    --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}' \
    --block-size 16
