#!/usr/bin/env bash
# Set up .venv (see scripts/setup.sh) and run the whole test suite. This is what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
EPDCTL_SETUP_SGLANG=${EPDCTL_SETUP_SGLANG:-1} bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
