#!/usr/bin/env bash
# SGLang 0.5.23's real server for CPU-only machines, in its own venv (.engines/sglang-cpu, beside
# .venv, so the control plane's torch 2.13 CPU pin is untouched). Idempotent; prints one line.
#
# What it installs and why (docs/real-engines.md, "SGLang"):
# - torch 2.14.1 and torchvision 0.29.1, as sglang 0.5.23 requires. PyPI has only the CUDA build
#   of torch 2.14.1 (it brings the nvidia-* libraries it links); it runs on a CPU. torchvision must
#   match it: SGLang imports it unconditionally.
# - sglang 0.5.23 --no-deps plus only what `launch_server` imports on CPU: its full requirements
#   pull the CUDA kernel stack (sglang-kernel, flashinfer, flash-attn-4, cutlass-dsl, deep-ep, ...).
# - the stand-in `sgl_kernel` (scripts/engines/sgl_kernel_standin): every function raises.
# - .engines/models/tiny-qwen2vl-sglang, the tiny model with vision_config.in_chans added
#   (scripts/engines/sglang_cpu_model.py): the model topologies/sglang-cpu-colocated.yaml serves.
# epdctl starts workers of `engine: {name: sglang, device: cpu}` with SGLANG_USE_CPU_ENGINE=1 and
# --device cpu; the topology adds --attention-backend torch_native.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=.engines/sglang-cpu
MODEL=.engines/models/tiny-qwen2vl-sglang
STANDIN=scripts/engines/sgl_kernel_standin/sgl_kernel
PY=${PYTHON:-python3}
REQS=(torch==2.14.1 torchvision==0.29.1 "transformers==5.19.0" "tokenizers==0.23.2" "openai==2.8.0"
      "openai-harmony==0.0.4" "xgrammar==0.2.7" "compressed-tensors==0.18.0" "sentencepiece==0.2.1"
      "soundfile==0.13.1" "apache-tvm-ffi==0.1.11" "python-dateutil<3" aiohttp fastapi uvicorn uvloop orjson
      pybase64 pyzmq psutil setproctitle msgspec prometheus-client requests tqdm pydantic python-multipart
      einops partial_json_parser interegular tiktoken scipy xxhash pyyaml safetensors regex watchfiles
      ipython dill gguf jsonschema)

WANT="sglang==0.5.23 ${REQS[*]}"  # what the marker records: a changed list installs again

verify() {  # the server's modules import on SGLang's CPU platform with the stand-in kernel in place
  SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" - <<'PY' 2>>"$VENV/pip-install.log"
import importlib.metadata as md
assert md.version("sglang") == "0.5.23" and md.version("torch").startswith("2.14.1"), "versions"
import sgl_kernel
assert sgl_kernel.STANDIN
import sglang.srt.entrypoints.http_server, sglang.srt.managers.scheduler  # noqa: F401
import sglang.srt.models.qwen2_vl, sglang.srt.multimodal.processors.qwen_vl  # noqa: F401
PY
}

if [ -f "$VENV/.epdctl-installed" ] && [ "$(cat "$VENV/.epdctl-installed")" = "$WANT" ]; then
  what="already installed"
else
  t0=$SECONDS
  rm -f "$VENV/.epdctl-installed"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  log=$VENV/pip-install.log
  pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q install)
  if ! { "${pip[@]}" "${REQS[@]}" && "${pip[@]}" --no-deps sglang==0.5.23; } >"$log" 2>&1; then
    echo "sglang-cpu: pip failed (full output: $log):" >&2; tail -20 "$log" >&2; exit 1
  fi
  what="installed in $((SECONDS - t0)) s"
fi
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if ! diff -rq -x __pycache__ "$STANDIN" "$site/sgl_kernel" >/dev/null 2>&1; then
  rm -rf "$site/sgl_kernel" && cp -r "$STANDIN" "$site/sgl_kernel" && rm -rf "$site/sgl_kernel/__pycache__"
  rm -f "$VENV/.epdctl-installed"
fi
if [ ! -f "$VENV/.epdctl-installed" ]; then
  verify || { echo "sglang-cpu: $VENV does not import SGLang's server (see $VENV/pip-install.log)" >&2; exit 1; }
  echo "$WANT" >"$VENV/.epdctl-installed"
  what="$what, $(du -sh "$VENV" | cut -f1)"
fi
"$PY" scripts/engines/sglang_cpu_model.py models/tiny-qwen2vl "$MODEL"
echo "sglang-cpu: SGLang 0.5.23 (torch 2.14.1, stand-in sgl_kernel) $what: $VENV; model $MODEL"
