#!/usr/bin/env bash
# epdctl plan for topology vllm-cpu-epd (engine vllm), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node local =====

# encoder-0: encoder, http://127.0.0.1:31300
env VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_ENABLE_V1_MULTIPROCESSING=0 \
  <REPO>/.engines/vllm-cpu/bin/vllm serve <REPO>/models/tiny-qwen2vl \
    --served-model-name tiny-qwen2vl \
    --host 127.0.0.1 \
    --port 31300 \
    --dtype float32 \
    --tensor-parallel-size 1 \
    --mm-encoder-only \
    --ec-transfer-config '{"ec_connector":"ECExampleConnector","ec_connector_extra_config":{"shared_storage_path":"/tmp/epdctl-store/vllm-cpu-epd/ec"},"ec_role":"ec_producer"}' \
    --no-enable-prefix-caching \
    --max-num-seqs 4 \
    --optimization-level=0 \
    --distributed-executor-backend=uni \
    --max-model-len=4096 \
    '--limit-mm-per-prompt={"image":8,"video":0}'

# prefill-0: prefill, http://127.0.0.1:31301
env VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_ENABLE_V1_MULTIPROCESSING=0 \
  <REPO>/.engines/vllm-cpu/bin/vllm serve <REPO>/models/tiny-qwen2vl \
    --served-model-name tiny-qwen2vl \
    --host 127.0.0.1 \
    --port 31301 \
    --dtype float32 \
    --tensor-parallel-size 1 \
    --ec-transfer-config '{"ec_connector":"ECExampleConnector","ec_connector_extra_config":{"shared_storage_path":"/tmp/epdctl-store/vllm-cpu-epd/ec"},"ec_role":"ec_consumer"}' \
    --kv-transfer-config '{"kv_connector":"ExampleConnector","kv_role":"kv_producer","kv_connector_extra_config":{"shared_storage_path":"/tmp/epdctl-store/vllm-cpu-epd/kv"}}' \
    --no-enable-prefix-caching \
    --block-size 32 \
    --max-num-seqs 4 \
    --optimization-level=0 \
    --distributed-executor-backend=uni \
    --max-model-len=4096 \
    '--limit-mm-per-prompt={"image":8,"video":0}'

# decode-0: decode, http://127.0.0.1:31302
env VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_ENABLE_V1_MULTIPROCESSING=0 \
  <REPO>/.engines/vllm-cpu/bin/vllm serve <REPO>/models/tiny-qwen2vl \
    --served-model-name tiny-qwen2vl \
    --host 127.0.0.1 \
    --port 31302 \
    --dtype float32 \
    --tensor-parallel-size 1 \
    --kv-transfer-config '{"kv_connector":"ExampleConnector","kv_role":"kv_consumer","kv_connector_extra_config":{"shared_storage_path":"/tmp/epdctl-store/vllm-cpu-epd/kv"}}' \
    --no-enable-prefix-caching \
    --block-size 32 \
    --max-num-seqs 4 \
    --optimization-level=0 \
    --distributed-executor-backend=uni \
    --max-model-len=4096 \
    '--limit-mm-per-prompt={"image":8,"video":0}'

# ===== node local =====

# router: http://127.0.0.1:31303 (metrics on port 31304)
python3 -m epdctl.node.epd_router \
    --encode http://127.0.0.1:31300 \
    --prefill http://127.0.0.1:31301 \
    --decode http://127.0.0.1:31302 \
    --host 127.0.0.1 \
    --port 31303 \
    --prometheus-host 127.0.0.1 \
    --prometheus-port 31304
