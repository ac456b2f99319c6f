#!/usr/bin/env bash
# epdctl plan for topology local (engine embedded), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node local =====

# encoder-0: encoder, http://127.0.0.1:31000
python3 -m epdctl.runtime encoder \
    --model-path <REPO>/models/tiny-qwen2vl \
    --host 127.0.0.1 \
    --port 31000 \
    --transport zmq \
    --transfer-port 31008 \
    --switchable \
    --threads 1

# encoder-1: encoder, http://127.0.0.1:31001
python3 -m epdctl.runtime encoder \
    --model-path <REPO>/models/tiny-qwen2vl \
    --host 127.0.0.1 \
    --port 31001 \
    --transport zmq \
    --transfer-port 31009 \
    --switchable \
    --threads 1

# prefill-0: prefill, http://127.0.0.1:31002
python3 -m epdctl.runtime prefill \
    --model-path <REPO>/models/tiny-qwen2vl \
    --served-model-name tiny-qwen2vl \
    --host 127.0.0.1 \
    --port 31002 \
    --bootstrap-port 31003 \
    --encoder-bootstrap-port 31004 \
    --encoder-urls http://127.0.0.1:31000 http://127.0.0.1:31001 \
    --transport zmq \
    --transfer-port 31010 \
    --switchable

# decode-0: decode, http://127.0.0.1:31005
python3 -m epdctl.runtime decode \
    --model-path <REPO>/models/tiny-qwen2vl \
    --served-model-name tiny-qwen2vl \
    --host 127.0.0.1 \
    --port 31005 \
    --transport zmq \
    --transfer-port 31011 \
    --switchable

# ===== node local =====

# router: http://127.0.0.1:31006 (metrics on port 31007)
python3 -m smg.launch_router \
    --pd-disaggregation \
    --prefill http://127.0.0.1:31002 31003 \
    --decode http://127.0.0.1:31005 \
    --host 127.0.0.1 \
    --port 31006 \
    --prometheus-host 127.0.0.1 \
    --prometheus-port 31007 \
    --max-payload-size 67108864 \
    --enable-igw \
    --health-check-interval-secs 1 \
    --health-failure-threshold 2 \
    --health-success-threshold 1 \
    --health-check-timeout-secs 5 \
    --worker-startup-check-interval 1 \
    --cb-timeout-duration-secs 2
