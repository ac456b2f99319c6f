#!/usr/bin/env bash
# Create .venv with everything epdctl, its embedded runtime and its tests need. Idempotent.
#   EPDCTL_SETUP_SGLANG=1  also installs sglang 0.5.23 (--no-deps) so tests check rendered
#                          commands with SGLang's own parser (CI does this).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! ldconfig -p 2>/dev/null | grep -q libibverbs.so.1; then
  # Mooncake's transfer engine links libibverbs even for its TCP protocol.
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq -o DPkg::Lock::Timeout=300 >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      -o DPkg::Lock::Timeout=300 libibverbs1 >/dev/null
  else
    echo "setup: libibverbs1 missing (needed by Mooncake); install it with: sudo apt-get install libibverbs1" >&2
  fi
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
source scripts/pip_quiet.sh
# The pinned CPU build first: an unpinned torch would pull a multi-GB CUDA build.
.venv/bin/python -c 'import torch' 2>/dev/null || pip_install torch==2.13.0
pip_install -e '.[runtime,mooncake,router,test,bench]'
.venv/bin/python -c 'import torch; assert torch.__version__.startswith("2.13.0"), torch.__version__'

if [ "${EPDCTL_SETUP_SGLANG:-0}" = 1 ]; then
  bash scripts/setup_sglang_check.sh
fi
