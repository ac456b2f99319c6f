#!/usr/bin/env bash
# epdctl plan for topology local-container (engine embedded), rendered by `epdctl render`.
# Each command is a long-running server: run each in its own shell (or let `epdctl up` do it),
# in the order below. ${NAME} references are read from your environment; no secret is written here.

# ===== node local =====

# encoder-0: encoder, http://127.0.0.1:31500
podman \
    --cgroup-manager=cgroupfs \
    --events-backend=file \
    --runtime runc run \
    --rm \
    --init \
    --name epdctl-local-container-encoder-0 \
    --label epdctl.cluster=local-container \
    --label epdctl.node=local \
    --label epdctl.process=encoder-0 \
    --network=host \
    --ipc=host \
    --ulimit memlock=8388608:8388608 \
    --ulimit nofile=20000:20000 \
    --ulimit nproc=32768:32768 \
    --volume <REPO>:<REPO>:ro \
    --volume <BASE_PYTHON>:<BASE_PYTHON>:ro \
    --env EPDCTL_CLUSTER \
    --env EPDCTL_WORKER \
    --env EPDCTL_TOKEN \
    --env PYTHONUNBUFFERED localhost/epdctl-runtime:bookworm <REPO>/.venv/bin/python -m epdctl.runtime encoder \
    --model-path <REPO>/models/tiny-qwen2vl \
    --host 127.0.0.1 \
    --port 31500 \
    --transport zmq \
    --transfer-port 31508 \
    --switchable \
    --threads 1

# encoder-1: encoder, http://127.0.0.1:31501
podman \
    --cgroup-manager=cgroupfs \
    --events-backend=file \
    --runtime runc run \
    --rm \
    --init \
    --name epdctl-local-container-encoder-1 \
    --label epdctl.cluster=local-container \
    --label epdctl.node=local \
    --label epdctl.process=encoder-1 \
    --network=host \
    --ipc=host \
    --ulimit memlock=8388608:8388608 \
    --ulimit nofile=20000:20000 \
    --ulimit nproc=32768:32768 \
    --volume <REPO>:<REPO>:ro \
    --volume <BASE_PYTHON>:<BASE_PYTHON>:ro \
    --env EPDCTL_CLUSTER \
    --env EPDCTL_WORKER \
    --env EPDCTL_TOKEN \
    --env PYTHONUNBUFFERED localhost/epdctl-runtime:bookworm <REPO>/.venv/bin/python -m epdctl.runtime encoder \
    --model-path <REPO>/models/tiny-qwen2vl \
    --host 127.0.0.1 \
    --port 31501 \
    --transport zmq \
    --transfer-port 31509 \
    --switchable \
    --threads 1

# prefill-0: prefill, http://127.0.0.1:31502
podman \
    --cgroup-manager=cgroupfs \
    --events-backend=file \
    --runtime runc run \
    --rm \
    --init \
    --name epdctl-local-container-prefill-0 \
    --label epdctl.cluster=local-container \
    --label epdctl.node=local \
    --label epdctl.process=prefill-0 \
    --network=host \
    --ipc=host \
    --ulimit memlock=8388608:8388608 \
    --ulimit nofile=20000:20000 \
    --ulimit nproc=32768:32768 \
    --volume <REPO>:<REPO>:ro \
    --volume <BASE_PYTHON>:<BASE_PYTHON>:ro \
    --env EPDCTL_CLUSTER \
    --env EPDCTL_WORKER \
    --env EPDCTL_TOKEN \
    --env PYTHONUNBUFFERED localhost/epdctl-runtime:bookworm <REPO>/.venv/bin/python -m epdctl.runtime prefill \
    --model-path <REPO>/models/tiny-qwen2vl \
    --served-model-name tiny-qwen2vl \
    --host 127.0.0.1 \
    --port 31502 \
    --bootstrap-port 31503 \
    --encoder-bootstrap-port 31504 \
    --encoder-urls http://127.0.0.1:31500 http://127.0.0.1:31501 \
    --transport zmq \
    --transfer-port 31510 \
    --switchable

# decode-0: decode, http://127.0.0.1:31505
podman \
    --cgroup-manager=cgroupfs \
    --events-backend=file \
    --runtime runc run \
    --rm \
    --init \
    --name epdctl-local-container-decode-0 \
    --label epdctl.cluster=local-container \
    --label epdctl.node=local \
    --label epdctl.process=decode-0 \
    --network=host \
    --ipc=host \
    --ulimit memlock=8388608:8388608 \
    --ulimit nofile=20000:20000 \
    --ulimit nproc=32768:32768 \
    --volume <REPO>:<REPO>:ro \
    --volume <BASE_PYTHON>:<BASE_PYTHON>:ro \
    --env EPDCTL_CLUSTER \
    --env EPDCTL_WORKER \
    --env EPDCTL_TOKEN \
    --env PYTHONUNBUFFERED localhost/epdctl-runtime:bookworm <REPO>/.venv/bin/python -m epdctl.runtime decode \
    --model-path <REPO>/models/tiny-qwen2vl \
    --served-model-name tiny-qwen2vl \
    --host 127.0.0.1 \
    --port 31505 \
    --transport zmq \
    --transfer-port 31511 \
    --switchable

# ===== node local =====

# router: http://127.0.0.1:31506 (metrics on port 31507)
<REPO>/.venv/bin/python -m smg.launch_router \
    --pd-disaggregation \
    --prefill http://127.0.0.1:31502 31503 \
    --decode http://127.0.0.1:31505 \
    --host 127.0.0.1 \
    --port 31506 \
    --prometheus-host 127.0.0.1 \
    --prometheus-port 31507 \
    --max-payload-size 67108864 \
    --enable-igw \
    --health-check-interval-secs 1 \
    --health-failure-threshold 2 \
    --health-success-threshold 1 \
    --health-check-timeout-secs 5 \
    --worker-startup-check-interval 1 \
    --cb-timeout-duration-secs 2
