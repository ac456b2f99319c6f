#!/usr/bin/env bash
# Build dist/epdctl.pyz: the control plane (validate, render, check, init, schema, up / status /
# down / logs / rebalance over SSH or SLURM) as one file to copy to a login node. No torch, no
# Pillow: the embedded runtime stays on the GPU nodes.
#
# How: shiv (from PyPI) installs epdctl and its core dependencies with pip into a zip app, binary
# wheels included (paramiko's bcrypt, cryptography and PyNaCl; PyYAML; psutil). On its first run
# the file unpacks them once to ~/.shiv (or $SHIV_ROOT), because compiled modules cannot be
# imported from inside a zip. Wheels match the Python that builds, so build with the login node's
# Python version: PYTHON=python3.11 bash scripts/build_pyz.sh. Output: $EPDCTL_PYZ or dist/epdctl.pyz.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${EPDCTL_PYZ:-dist/epdctl.pyz}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
t0=$(date +%s)
"$PY" -m venv "$work/venv"
"$work/venv/bin/python" -m pip --disable-pip-version-check -q install shiv 2>&1 | grep -v "^WARNING: Location" || true
"$work/venv/bin/python" -c 'import shiv' # the install above must have worked
mkdir -p "$(dirname "$OUT")"
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)} \
  "$work/venv/bin/shiv" --compressed --reproducible -p '/usr/bin/env python3' -e epdctl.cli:main \
  -o "$OUT" --disable-pip-version-check -q . 2>&1 | grep -v -e "^WARNING: Location" -e "^ *$" || true
[ -s "$OUT" ] || { echo "build_pyz: $OUT was not written (see the pip output above)" >&2; exit 1; }
echo "built $OUT ($(du -h "$OUT" | cut -f1), $(( $(date +%s) - t0 )) s) for $("$PY" -c 'import sys; print("Python %d.%d" % sys.version_info[:2])')"
