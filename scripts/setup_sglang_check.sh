#!/usr/bin/env bash
# Install the REAL engine parsers (SGLang 0.5.23, vLLM 0.33.0) into .venv so tests check every
# rendered command with the engines' own argparse parsers (tests/test_engine_parsers.py).
# Both are installed --no-deps (their full dependencies pull a CUDA torch); only what their
# parsers import is added, under a constraint that keeps the CPU torch 2.13.0 in place.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/pip_quiet.sh
if .venv/bin/python -c 'import sglang.srt.server_args, vllm.entrypoints.common.cli_args' 2>/dev/null; then
  exit 0
fi
cons=$(mktemp)
.venv/bin/python - "$cons" <<'PY'
import sys, importlib.metadata as md
pins = {n: md.version(n) for n in ("torch", "transformers", "numpy")}
open(sys.argv[1], "w").write("".join(f"{n}=={v}\n" for n, v in pins.items()))
PY
pip_install --no-deps sglang==0.5.23 vllm==0.33.0
pip_install -c "$cons" orjson pybase64 triton starlette msgspec ipython prometheus-client \
  cbor2 openai-harmony cloudpickle cachetools uvloop py-cpuinfo fastapi partial-json-parser \
  llguidance xgrammar
rm -f "$cons"
.venv/bin/python -c 'import torch; assert torch.__version__.startswith("2.13.0"), torch.__version__'
