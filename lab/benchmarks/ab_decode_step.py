"""Decode-step settings A/B'd in one process, block by block: what a change is worth under load.

On a shared 2-core host a 1-stream step swings 1.2-3 ms between runs of the same code, so runs
of old and new code one after another cannot resolve a 20 % change. Here every setting keeps its
own engines, and the settings and batch sizes take turns ``--block`` steps at a time: a burst of
load hits all of them alike. Both sides decode the same 16 real prefills bench_decode_batch.py
decodes: one engine runs all 16 together, and each request also has a 1-stream engine of its
own; the 1-stream turn after each 16-stream one takes the next request in order (16 turns cover
every request once) and first steps its engine, untimed, to the 16-stream engine's position, so
both sides time the same steps of the same requests; each timed turn follows one untimed step of
its own engine (the caches hold what a running server's would, not another engine's data). Each engine decodes ``--tokens`` tokens per stream like
bench_decode_batch.py, then starts over (a new engine, outside the timing), so the KV lengths
stay those of that benchmark. Per setting and batch size: the least and the median time per
step (the 1-stream side: each request's least / median, averaged over the requests, i.e. the
steps of decoding them one at a time), wall clock and the process's CPU time (every thread
counted, so two threads' CPU-seconds show), tokens/s and tokens per CPU-second, and 16 streams'
tokens/s over the same requests' one at a time (the #18 goal: >= 10x): from least times, from
medians, and the median of each turn's own ratio (its 1-stream turn against the 16-stream turn
just before it).

Settings: ``torch`` (attention as torch's grouped matmuls, slot_attention.py), ``native`` (the
C loop, native_attention.py), ``native+pool`` (the C loop, and steps of ``--pool-rows``+ rows on
the worker's whole pool of ``--threads`` threads; 1-row steps stay on one thread). Compare
``native+pool`` with ``native`` in a process of its own (``--threads 2 --settings native
native+pool``): a pool's threads spin or sleep between parallel regions (OMP_WAIT_POLICY), which
would spill into the one-thread settings' turns.

    .venv/bin/python lab/benchmarks/ab_decode_step.py [--blocks 40] [--block 8] [--threads 1]
Writes lab/benchmarks/results/decode_ab.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "lab" / "benchmarks"))

from bench_decode_batch import prefills  # noqa: E402
from bench_stages import model_dir  # noqa: E402
from epdctl.runtime.fast.decode import FastDecodeEngine as DecodeEngine  # noqa: E402
from epdctl.runtime.model import load_bundle  # noqa: E402
from epdctl.runtime.sampling import SamplingParams  # noqa: E402

SIZES = (1, 16)


def engine(bundle: Any, results: list, n: int, steps: int, setting: str, pool_rows: int) -> DecodeEngine:
    """``n`` streams (``results[:n]``) past their join step, ``steps`` more steps to run, under ``setting``."""
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


Key = tuple[str, int, int]  # (setting, streams, request the 1-stream engine holds)


def run_turns(fresh: Callable[[Key], Any], keys: list[Key], settings: list[str], blocks: int, block: int, steps: int,
              wide: int) -> tuple[dict[Key, list[float]], dict[Key, list[float]], list[tuple[Key, int]]]:
    """Per key, seconds per step of each timed turn (wall, CPU), and which (key, steps left) each turn began at.
    Each turn of a setting: ``block`` steps of the ``wide`` engine, then of one 1-stream engine (requests in
    order) stepped, untimed, to the same position first; every timed turn follows one untimed step of its engine."""
    engines = {k: fresh(k) for k in keys}
    left = dict.fromkeys(keys, steps)
    wall: dict[Key, list[float]] = {k: [] for k in keys}
    cpu: dict[Key, list[float]] = {k: [] for k in keys}
    log: list[tuple[Key, int]] = []
    for turn in range(blocks):
        for setting in settings:
            many = (setting, wide, 0)
            if left[many] <= block:
                engines[many], left[many] = fresh(many), steps
            at = left[many] - 1  # both sides: one untimed step first (a warm engine, as in a running server)
            for key in (many, (setting, 1, turn % wide)):  # the 1-stream turn: the same positions of its request
                if left[key] <= at:
                    engines[key], left[key] = fresh(key), steps
                eng = engines[key]
                while left[key] > at:  # untimed: the warm-up step (and catching up to the 16-stream position)
                    eng.step()
                    left[key] -= 1
                log.append((key, left[key]))
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(block):
                    eng.step()
                wall[key].append((time.perf_counter() - t0) / block)
                cpu[key].append((time.process_time() - c0) / block)
                left[key] -= block
    return wall, cpu, log


def turn_ratios(times: dict[Key, list[float]], setting: str, wide: int) -> list[float]:
    """Per turn: ``wide`` x the 1-stream turn's time over the ``wide``-stream turn's just before it (the same
    steps, seconds apart: load that drifts over the run cancels in each ratio)."""
    many = times[setting, wide, 0]
    return [wide * times[setting, 1, t % wide][t // wide] / many[t] for t in range(len(many))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="checkpoint folder (default: models/tiny-qwen2vl, else a random tiny one)")
    ap.add_argument("--blocks", type=int, default=48, help="turns per setting and batch size (16 cover every request)")
    ap.add_argument("--block", type=int, default=8, help="steps per turn")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per stream before an engine starts over")
    ap.add_argument("--threads", type=int, default=1, help="torch's pool (what the '+pool' setting uses)")
    ap.add_argument("--pool-rows", type=int, default=16, help="'+pool': steps of this many rows use the pool")
    ap.add_argument("--settings", nargs="+", default=["torch", "native"],
                    choices=["torch", "native", "native+pool"])
    ap.add_argument("--out", default=str(ROOT / "lab" / "benchmarks" / "results" / "decode_ab.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    path, source = model_dir(args.model)
    bundle = load_bundle(path, role="colocated")
    results = prefills(bundle, max(SIZES), SamplingParams(max_tokens=8, ignore_eos=True))
    steps = (args.tokens - 2) // args.block * args.block  # whole turns per engine
    wide = max(SIZES)
    keys = [(s, n, r) for s in args.settings for n in SIZES for r in (range(wide) if n == 1 else [0])]

    def fresh(key: tuple[str, int, int]) -> DecodeEngine:
        setting, n, r = key
        return engine(bundle, results[r:r + n], n, steps, setting, args.pool_rows)

    load0 = os.getloadavg()[0]
    wall, cpu, _ = run_turns(fresh, keys, args.settings, args.blocks, args.block, steps, wide)

    def side(times: dict, setting: str, n: int, stat: Any) -> float:
        """Seconds per step: the statistic of each request's turns, averaged over the requests."""
        per = [stat(t) for (s, m, _), t in times.items() if s == setting and m == n and t]
        return sum(per) / len(per)

    rows: list[dict[str, Any]] = []
    print(f"{'setting':>12} {'streams':>7} {'ms/step min':>11} {'median':>7} {'CPU ms min':>10} {'median':>7} "
          f"{'tokens/s':>9} {'tok/CPU-s':>9}")
    for setting in args.settings:
        for n in SIZES:
            row: dict[str, Any] = {"setting": setting, "streams": n,
                                   "ms_min": side(wall, setting, n, min) * 1e3,
                                   "ms_median": side(wall, setting, n, statistics.median) * 1e3,
                                   "cpu_ms_min": side(cpu, setting, n, min) * 1e3,
                                   "cpu_ms_median": side(cpu, setting, n, statistics.median) * 1e3}
            row.update(tokens_per_s=n / row["ms_min"] * 1e3, tokens_per_cpu_s=n / row["cpu_ms_min"] * 1e3)
            rows.append(row)
            print(f"{setting:>12} {n:7d} {row['ms_min']:11.3f} {row['ms_median']:7.3f} {row['cpu_ms_min']:10.3f} "
                  f"{row['cpu_ms_median']:7.3f} {row['tokens_per_s']:9.0f} {row['tokens_per_cpu_s']:9.0f}")
    by = {(r["setting"], r["streams"]): r for r in rows}
    summary = {}
    for setting in args.settings:
        one, many = by[setting, 1], by[setting, wide]
        summary[setting] = {"x_min": one["ms_min"] * wide / many["ms_min"],
                            "x_median": one["ms_median"] * wide / many["ms_median"],
                            "x_cpu": one["cpu_ms_min"] * wide / many["cpu_ms_min"],
                            "x_turns_median": statistics.median(turn_ratios(wall, setting, wide))}
        s = summary[setting]
        print(f"{setting}: 16 streams / the same requests one at a time, tokens/s {s['x_min']:.2f}x (least times), "
              f"{s['x_median']:.2f}x (medians), {s['x_turns_median']:.2f}x (median of the turns' own ratios); "
              f"tokens per CPU-second {s['x_cpu']:.2f}x")
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
