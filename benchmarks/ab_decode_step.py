"""Decode-step settings A/B'd in one process, block by block: what a change is worth under load.

On a shared 2-core host a 1-stream step swings 1.2-3 ms between runs of the same code, so runs
of old and new code one after another cannot resolve a 20 % change. Here every setting keeps its
own engines (1 and 16 streams of the same real prefills bench_decode_batch.py decodes), and the
settings take turns ``--block`` steps at a time: a burst of load hits all of them alike. Each
engine decodes ``--tokens`` tokens per stream like bench_decode_batch.py, then starts over
(a new engine, outside the timing), so the KV lengths stay those of that benchmark.
Per setting and batch size: the least and the median time per step (wall clock and the
process's CPU time, every thread counted, so two threads' CPU-seconds show), tokens/s and
tokens per CPU-second, and 16 streams' tokens/s over one stream's (the #18 goal: >= 10x).

Settings: ``torch`` (attention as torch's grouped matmuls, slot_attention.py), ``native`` (the
C loop, native_attention.py), ``native+pool`` (the C loop, and steps of ``--pool-rows``+ rows on
the worker's whole pool of ``--threads`` threads; 1-row steps stay on one thread). Compare
``native+pool`` with ``native`` in a process of its own (``--threads 2 --settings native
native+pool``): a pool's threads spin or sleep between parallel regions (OMP_WAIT_POLICY), which
would spill into the one-thread settings' turns.

    .venv/bin/python benchmarks/ab_decode_step.py [--blocks 40] [--block 8] [--threads 1]
Writes benchmarks/results/decode_ab.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_decode_batch import prefills  # noqa: E402
from bench_stages import model_dir  # noqa: E402
from epdctl.runtime.decode_engine import DecodeEngine  # noqa: E402
from epdctl.runtime.model import load_bundle  # noqa: E402
from epdctl.runtime.sampling import SamplingParams  # noqa: E402

SIZES = (1, 16)


def engine(bundle: Any, results: list, n: int, steps: int, setting: str, pool_rows: int) -> DecodeEngine:
    """``n`` streams past their join step, ``steps`` more steps to run, under ``setting``."""
    eng = DecodeEngine(bundle, max_running=n)
    if setting == "torch":
        eng.native = None
    elif eng.native is None:
        raise SystemExit("the native attention did not build here (see the log); only 'torch' can run")
    if setting.endswith("+pool"):
        eng.threads.min_macs = pool_rows * eng.threads.macs_per_row
    else:
        eng.threads.min_macs = 1 << 62  # every step on one thread
    params = SamplingParams(max_tokens=steps + 2, ignore_eos=True)
    for i in range(n):
        eng.add(f"s{i}", results[i], params)
    eng.step()  # the join step: the prefill's tokens and the first batched forward
    return eng


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="checkpoint folder (default: models/tiny-qwen2vl, else a random tiny one)")
    ap.add_argument("--blocks", type=int, default=40, help="turns per setting and batch size")
    ap.add_argument("--block", type=int, default=8, help="steps per turn")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per stream before an engine starts over")
    ap.add_argument("--threads", type=int, default=1, help="torch's pool (what the '+pool' setting uses)")
    ap.add_argument("--pool-rows", type=int, default=16, help="'+pool': steps of this many rows use the pool")
    ap.add_argument("--settings", nargs="+", default=["torch", "native"],
                    choices=["torch", "native", "native+pool"])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "decode_ab.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    path, source = model_dir(args.model)
    bundle = load_bundle(path, role="colocated")
    results = prefills(bundle, max(SIZES), SamplingParams(max_tokens=8, ignore_eos=True))
    steps = (args.tokens - 2) // args.block * args.block  # whole turns per engine
    keys = [(s, n) for s in args.settings for n in SIZES]
    engines = {k: engine(bundle, results, k[1], steps, k[0], args.pool_rows) for k in keys}
    left = dict.fromkeys(keys, steps)
    wall: dict[tuple[str, int], list[float]] = {k: [] for k in keys}
    cpu: dict[tuple[str, int], list[float]] = {k: [] for k in keys}
    load0 = os.getloadavg()[0]
    for _ in range(args.blocks):
        for key in keys:
            if left[key] < args.block:
                engines[key], left[key] = engine(bundle, results, key[1], steps, key[0], args.pool_rows), steps
            eng, left[key] = engines[key], left[key] - args.block
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(args.block):
                eng.step()
            wall[key].append((time.perf_counter() - t0) / args.block)
            cpu[key].append((time.process_time() - c0) / args.block)
    rows: list[dict[str, Any]] = []
    print(f"{'setting':>12} {'streams':>7} {'ms/step min':>11} {'median':>7} {'CPU ms min':>10} {'median':>7} "
          f"{'tokens/s':>9} {'tok/CPU-s':>9}")
    for (setting, n), w in wall.items():
        c = cpu[setting, n]
        row: dict[str, Any] = {"setting": setting, "streams": n, "ms_min": min(w) * 1e3, "ms_median": statistics.median(w) * 1e3,
               "cpu_ms_min": min(c) * 1e3, "cpu_ms_median": statistics.median(c) * 1e3,
               "tokens_per_s": n / min(w), "tokens_per_cpu_s": n / min(c)}
        rows.append(row)
        print(f"{setting:>12} {n:7d} {row['ms_min']:11.3f} {row['ms_median']:7.3f} {row['cpu_ms_min']:10.3f} "
              f"{row['cpu_ms_median']:7.3f} {row['tokens_per_s']:9.0f} {row['tokens_per_cpu_s']:9.0f}")
    by = {(r["setting"], r["streams"]): r for r in rows}
    summary = {}
    for setting in args.settings:
        one, wide = by[setting, 1], by[setting, 16]
        summary[setting] = {"x_min": one["ms_min"] * 16 / wide["ms_min"],
                            "x_median": one["ms_median"] * 16 / wide["ms_median"],
                            "x_cpu": one["cpu_ms_min"] * 16 / wide["cpu_ms_min"]}
        s = summary[setting]
        print(f"{setting}: 16 streams / 1 stream tokens/s {s['x_min']:.2f}x (least times), {s['x_median']:.2f}x "
              f"(medians); tokens per CPU-second {s['x_cpu']:.2f}x")
    load1 = os.getloadavg()[0]
    print(f"pool {args.threads} threads for steps of {args.pool_rows}+ rows ('+pool' only); {args.blocks} turns of "
          f"{args.block} steps per setting and batch size; load {load0:.2f} -> {load1:.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": source, "threads": args.threads, "pool_rows": args.pool_rows,
                               "blocks": args.blocks, "block": args.block, "load_avg_1m": [load0, load1],
                               "rows": rows, "summary": summary}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
