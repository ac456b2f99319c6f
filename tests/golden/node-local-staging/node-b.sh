#!/usr/bin/env bash
# epdctl plan for topology node-local-staging (engine embedded), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node node-b =====
source ~/epdctl/.venv/bin/activate

# prefill-0: prefill, http://127.0.0.3:35100
python3 -m epdctl.runtime prefill \
    --model-path /local/nvme/qwen2-vl-2b \
    --served-model-name qwen2-vl-2b \
    --host 127.0.0.3 \
    --port 35100 \
    --bootstrap-port 35101 \
    --encoder-bootstrap-port 35102 \
    --encoder-urls http://127.0.0.2:35100 \
    --transport zmq \
    --transfer-port 35103 \
    --switchable
