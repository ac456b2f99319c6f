#!/usr/bin/env bash
# epdctl plan for topology shared-fs-site (engine sglang), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node g0 =====

# encoder-0: encoder, GPUs 0, http://g0.slurm:30000
python3 -m sglang.launch_server \
    --model-path /shared/hf/hub/models--Qwen--Qwen2.5-VL-7B-Instruct/snapshots/main \
    --served-model-name qwen2.5-vl-7b \
    --host g0.slurm \
    --port 30000 \
    --tp-size 1 \
    --base-gpu-id 0 \
    --encoder-only \
    --mem-fraction-static 0.85

# encoder-1: encoder, GPUs 1, http://g0.slurm:30001
python3 -m sglang.launch_server \
    --model-path /shared/hf/hub/models--Qwen--Qwen2.5-VL-7B-Instruct/snapshots/main \
    --served-model-name qwen2.5-vl-7b \
    --host g0.slurm \
    --port 30001 \
    --tp-size 1 \
    --base-gpu-id 1 \
    --encoder-only \
    --mem-fraction-static 0.85

# prefill-0: prefill, GPUs 2,3,4,5, http://g0.slurm:30002
python3 -m sglang.launch_server \
    --model-path /shared/hf/hub/models--Qwen--Qwen2.5-VL-7B-Instruct/snapshots/main \
    --served-model-name qwen2.5-vl-7b \
    --host g0.slurm \
    --port 30002 \
    --tp-size 4 \
    --base-gpu-id 2 \
    --disaggregation-mode prefill \
    --disaggregation-bootstrap-port 30003 \
    --disaggregation-transfer-backend mooncake \
    --disaggregation-ib-device mlx5_0 \
    --language-only \
    --encoder-urls http://g0.slurm:30000 http://g0.slurm:30001 \
    --encoder-bootstrap-port 30004 \
    --mem-fraction-static 0.85 \
    --enable-metrics

# router: http://g0.slurm:30005 (metrics on port 30006)
python3 -m smg.launch_router \
    --pd-disaggregation \
    --prefill http://g0.slurm:30002 30003 \
    --decode http://g1.slurm:30000 \
    --host g0.slurm \
    --port 30005 \
    --prometheus-host g0.slurm \
    --prometheus-port 30006 \
    --max-payload-size 67108864 \
    --enable-igw \
    --health-check-interval-secs 1 \
    --health-failure-threshold 2 \
    --health-success-threshold 1 \
    --health-check-timeout-secs 5 \
    --worker-startup-check-interval 1 \
    --cb-timeout-duration-secs 2
