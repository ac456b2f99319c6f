"""The stand-in sgl_kernel (scripts/engines/sgl_kernel_standin): its names raise and are recorded.

Run in a subprocess: importing it registers ops in ``torch.ops.sgl_kernel`` for the whole process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "scripts" / "engines" / "sgl_kernel_standin"

PROBE = r"""
import torch, sgl_kernel
from sgl_kernel import copy_all_layer_kv_cache_cpu
out = []
for name in sorted(sgl_kernel.NAMES):
    try:
        getattr(sgl_kernel, name)(1, 2)
    except sgl_kernel.StandinKernelCalled:
        out.append(name)
x, gate = torch.zeros(4), torch.zeros(4)
try:
    torch.ops.sgl_kernel.fused_sigmoid_mul_cpu(x, gate)  # SGLang's own call (sglang/srt/models/qwen3_5.py)
except sgl_kernel.StandinKernelCalled:
    out.append("op")
try:
    from sgl_kernel import flash_attn_varlen_func  # a kernel SGLang imports guarded: stays missing
except ImportError:
    out.append("missing")
print(len(out), out[-2:])
"""


def test_every_name_raises_and_every_call_is_recorded(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    env = dict(os.environ, PYTHONPATH=str(STANDIN), EPDCTL_KERNEL_STANDIN_LOG=str(log))
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, text=True, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "10 ['op', 'missing']"
    lines = log.read_text().splitlines()
    assert lines[0].startswith("load pid=")
    calls = [line.split()[1] for line in lines if line.startswith("call ")]
    assert calls == [f"sgl_kernel.{n}" for n in sorted(_names())] + ["torch.ops.sgl_kernel.fused_sigmoid_mul_cpu"]


def _names() -> list[str]:
    proc = subprocess.run([sys.executable, "-c", "import sgl_kernel; print(' '.join(sorted(sgl_kernel.NAMES)))"],
                          env=dict(os.environ, PYTHONPATH=str(STANDIN)), text=True, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()
