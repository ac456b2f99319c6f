#!/usr/bin/env bash
# epdctl plan for topology slurm-by-count (engine embedded), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node encoder-n0 =====

# encoder-0: encoder, http://encoder-n0.slurm:37100
python3 -m epdctl.runtime encoder \
    --model-path <REPO>/models/tiny-qwen2vl \
    --host encoder-n0.slurm \
    --port 37100 \
    --transport zmq \
    --transfer-port 37103 \
    --switchable

# ===== node prefill-n0 =====

# prefill-0: prefill, http://prefill-n0.slurm:37200
python3 -m epdctl.runtime prefill \
    --model-path <REPO>/models/tiny-qwen2vl \
    --served-model-name tiny-qwen2vl \
    --host prefill-n0.slurm \
    --port 37200 \
    --bootstrap-port 37201 \
    --encoder-bootstrap-port 37202 \
    --encoder-urls http://encoder-n0.slurm:37100 \
    --transport zmq \
    --transfer-port 37203 \
    --switchable

# ===== node prefill-n1 =====

# prefill-1: prefill, http://prefill-n1.slurm:37300
python3 -m epdctl.runtime prefill \
    --model-path <REPO>/models/tiny-qwen2vl \
    --served-model-name tiny-qwen2vl \
    --host prefill-n1.slurm \
    --port 37300 \
    --bootstrap-port 37301 \
    --encoder-bootstrap-port 37302 \
    --encoder-urls http://encoder-n0.slurm:37100 \
    --transport zmq \
    --transfer-port 37303 \
    --switchable

# ===== node decode-n0 =====

# decode-0: decode, http://decode-n0.slurm:37400
python3 -m epdctl.runtime decode \
    --model-path <REPO>/models/tiny-qwen2vl \
    --served-model-name tiny-qwen2vl \
    --host decode-n0.slurm \
    --port 37400 \
    --transport zmq \
    --transfer-port 37401 \
    --switchable

# ===== node encoder-n0 =====

# router: http://encoder-n0.slurm:37101 (metrics on port 37102)
python3 -m smg.launch_router \
    --pd-disaggregation \
    --prefill http://prefill-n0.slurm:37200 37201 \
    --prefill http://prefill-n1.slurm:37300 37301 \
    --decode http://decode-n0.slurm:37400 \
    --host encoder-n0.slurm \
    --port 37101 \
    --prometheus-host encoder-n0.slurm \
    --prometheus-port 37102 \
    --max-payload-size 67108864 \
    --enable-igw \
    --health-check-interval-secs 1 \
    --health-failure-threshold 2 \
    --health-success-threshold 1 \
    --health-check-timeout-secs 5 \
    --worker-startup-check-interval 1 \
    --cb-timeout-duration-secs 2
