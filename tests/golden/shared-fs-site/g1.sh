#!/usr/bin/env bash
# epdctl plan for topology shared-fs-site (engine sglang), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node g1 =====

# decode-0: decode, GPUs 0,1,2,3,4,5,6,7, http://g1.slurm:30000
python3 -m sglang.launch_server \
    --model-path /shared/hf/hub/models--Qwen--Qwen2.5-VL-7B-Instruct/snapshots/main \
    --served-model-name qwen2.5-vl-7b \
    --host g1.slurm \
    --port 30000 \
    --tp-size 8 \
    --base-gpu-id 0 \
    --disaggregation-mode decode \
    --disaggregation-transfer-backend mooncake \
    --disaggregation-ib-device mlx5_0 \
    --mem-fraction-static 0.85 \
    --enable-metrics
