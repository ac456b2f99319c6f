"""One decoder layer's GEMMs of the tiny model in fp32 and in bf16 (AMX where the core has it), at
1 and 16 rows: whether bf16 would lift the decode's 16-stream / 1-stream ratio.

Shapes (out, in) from models/tiny-qwen2vl: q/k/v fused (256, 128), o (128, 128), gate/up fused
(1024, 128), down (128, 512), and the tied lm head (373, 128). Each variant is timed as the sum of
the five calls, one torch thread, best of 5 blocks of 3,000 calls; variants run in the same
minutes, so compare within a row. Variants: ``fp32`` (F.linear, what the decode runs), ``bf16``
(F.linear on bf16 tensors), ``bf16 prepacked`` (oneDNN's ``_linear_pointwise`` on weights reordered
once for the row count, as inductor's freezing does). Measured, not asserted.

    .venv/bin/python benchmarks/bench_bf16_linear.py [--calls 3000]
Writes benchmarks/results/bf16_linear.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [(256, 128), (128, 128), (1024, 128), (128, 512), (373, 128)]


def best_us(fn: Callable[[], object], calls: int) -> float:
    for _ in range(calls // 10):
        fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def variants(rows: int, out_f: int, in_f: int) -> dict[str, Callable[[], object]]:
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(out_f, in_f, generator=g), torch.randn(rows, in_f, generator=g)
    wb, xb = w.bfloat16(), x.bfloat16()
    out: dict[str, Callable[[], object]] = {"fp32": lambda: F.linear(x, w), "bf16": lambda: F.linear(xb, wb)}
    mkldnn = torch.ops.mkldnn
    if torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_reorder_linear_weight"):
        packed = mkldnn._reorder_linear_weight(wb, rows)
        out["bf16 prepacked"] = lambda: mkldnn._linear_pointwise(xb, packed, None, "none", [], "")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/bf16_linear.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    amx = "amx_bf16" in Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else False
    load0 = os.getloadavg()[0]
    rows_out = []
    for rows in (1, 16):
        sums: dict[str, float] = {}
        for out_f, in_f in SHAPES:
            for name, fn in variants(rows, out_f, in_f).items():
                sums[name] = sums.get(name, 0.0) + best_us(fn, args.calls)
        rows_out.append({"rows": rows, "layer_gemms_us": sums})
    print(f"one layer's five GEMMs, µs (one thread; amx_bf16 {'present' if amx else 'absent'}; "
          f"load {load0:.2f} -> {os.getloadavg()[0]:.2f})")
    names = list(rows_out[0]["layer_gemms_us"])
    print(f"{'rows':>4} " + " ".join(f"{n:>15}" for n in names) + f" {'bf16 best / fp32':>17}")
    for r in rows_out:
        us = r["layer_gemms_us"]
        print(f"{r['rows']:>4} " + " ".join(f"{us[n]:15.1f}" for n in names)
              + f" {min(v for k, v in us.items() if k != 'fp32') / us['fp32']:17.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"amx_bf16": amx, "threads": 1, "calls": args.calls,
                                    "load_avg_1m": load0, "rows": rows_out}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
