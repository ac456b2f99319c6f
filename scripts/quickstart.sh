#!/usr/bin/env bash
# The main job on a fresh machine: set up .venv, start a local EPD cluster on the embedded
# runtime (2 encoders, 1 prefill, 1 decode behind the smg router), send it a real multi-image
# request and print the answer with per-stage timings. Stop it with: .venv/bin/epdctl down local
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/epdctl up topologies/local.yaml "$@"
