#!/usr/bin/env bash
# epdctl plan for topology vllm-llava-onevision (engine vllm), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node v0 =====

# encoder-0: encoder, GPUs 0, http://10.2.0.10:30000
env CUDA_VISIBLE_DEVICES=0 \
  vllm serve /models/llava-onevision-qwen2-7b-ov-hf \
    --served-model-name llava-onevision-7b \
    --host 10.2.0.10 \
    --port 30000 \
    --dtype bfloat16 \
    --tensor-parallel-size 1 \
    --mm-encoder-only \
    --ec-transfer-config '{"ec_connector":"ECExampleConnector","ec_connector_extra_config":{"shared_storage_path":"/shared/epdctl/ec-cache"},"ec_role":"ec_producer"}' \
    --disable-prefix-caching \
    --block-size 16 \
    --gpu-memory-utilization 0.1

# encoder-1: encoder, GPUs 1, http://10.2.0.10:30001
env CUDA_VISIBLE_DEVICES=1 \
  vllm serve /models/llava-onevision-qwen2-7b-ov-hf \
    --served-model-name llava-onevision-7b \
    --host 10.2.0.10 \
    --port 30001 \
    --dtype bfloat16 \
    --tensor-parallel-size 1 \
    --mm-encoder-only \
    --ec-transfer-config '{"ec_connector":"ECExampleConnector","ec_connector_extra_config":{"shared_storage_path":"/shared/epdctl/ec-cache"},"ec_role":"ec_producer"}' \
    --disable-prefix-caching \
    --block-size 16 \
    --gpu-memory-utilization 0.1

# prefill-0: prefill, GPUs 2,3, http://10.2.0.10:30002
env CUDA_VISIBLE_DEVICES=2,3 UCX_NET_DEVICES=mlx5_2:1 VLLM_NIXL_SIDE_CHANNEL_HOST=10.2.0.10 VLLM_NIXL_SIDE_CHANNEL_PORT=30003 \
  vllm serve /models/llava-onevision-qwen2-7b-ov-hf \
    --served-model-name llava-onevision-7b \
    --host 10.2.0.10 \
    --port 30002 \
    --dtype bfloat16 \
    --tensor-parallel-size 2 \
    --ec-transfer-config '{"ec_connector":"ECExampleConnector","ec_connector_extra_config":{"shared_storage_path":"/shared/epdctl/ec-cache"},"ec_role":"ec_consumer"}' \
    --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}' \
    --max-num-batched-tokens 8192 \
    --block-size 16

# prefill-1: prefill, GPUs 4,5, http://10.2.0.10:30004
env CUDA_VISIBLE_DEVICES=4,5 UCX_NET_DEVICES=mlx5_2:1 VLLM_NIXL_SIDE_CHANNEL_HOST=10.2.0.10 VLLM_NIXL_SIDE_CHANNEL_PORT=30005 \
  vllm serve /models/llava-onevision-qwen2-7b-ov-hf \
    --served-model-name llava-onevision-7b \
    --host 10.2.0.10 \
    --port 30004 \
    --dtype bfloat16 \
    --tensor-parallel-size 2 \
    --ec-transfer-config '{"ec_connector":"ECExampleConnector","ec_connector_extra_config":{"shared_storage_path":"/shared/epdctl/ec-cache"},"ec_role":"ec_consumer"}' \
    --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}' \
    --max-num-batched-tokens 8192 \
    --block-size 16

# router: http://10.2.0.10:8000 (metrics on port 29000)
python3 -m smg.launch_router \
    --pd-disaggregation \
    --prefill http://10.2.0.10:30002 \
    --prefill http://10.2.0.10:30004 \
    --decode http://10.2.0.11:30000 \
    --decode http://10.2.0.11:30002 \
    --host 10.2.0.10 \
    --port 8000 \
    --prometheus-host 10.2.0.10 \
    --prometheus-port 29000 \
    --max-payload-size 67108864 \
    --enable-igw \
    --health-check-interval-secs 1 \
    --health-failure-threshold 2 \
    --health-success-threshold 1 \
    --health-check-timeout-secs 5 \
    --worker-startup-check-interval 1 \
    --cb-timeout-duration-secs 2
