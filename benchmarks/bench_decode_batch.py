"""Decode batching: n concurrent streams in one DecodeEngine against the same n requests decoded one at a time.

Measured, not asserted. The requests are real prefills (tiny model, request i holds 1 + i % 8
images, so prompts differ in length); every stream runs ``--tokens`` tokens (ignore_eos). Both
sides decode the SAME requests: the batched row runs the first n together, the 1-stream side
runs each of them alone, one after another, and the speed-up is the ratio of the two tokens/s.
Every turn (``--reps``) runs both sides of every row, in alternating order, so a change of the
shared host's load hits both; reported are the least time (best turn), the median of the turns,
and the median of each turn's own ratio. Besides whole runs (what a client sees: the join step,
where each prefill's KV is copied into its slot, and every later step), the steady steps alone
(after the join) are timed: that figure is what ``lab/benchmarks/ab_decode_step.py`` measures, step blocks of
long-lived engines.
Modes: greedy; greedy with streams joining one per step while the batch runs (continuous
batching; its 1-stream side is the greedy one of the same turn); sampled (temperature 0.8,
top-p 0.95, each stream its own seed). CPU figures use the decoding thread's time
(``time.thread_time``: with one torch thread every op runs on it; preemptions do not count).
Uses models/tiny-qwen2vl when it holds a checkpoint, else a tiny random one.
Writes benchmarks/results/decode_batch.json.

    .venv/bin/python benchmarks/bench_decode_batch.py [--tokens 64] [--reps 5] [--streams 16] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_stages import model_dir  # noqa: E402
from epdctl.runtime.fast.decode import FastDecodeEngine as DecodeEngine  # noqa: E402
from epdctl.runtime.encoder_engine import VisionEncoder  # noqa: E402
from epdctl.runtime.model import load_bundle  # noqa: E402
from epdctl.runtime.prefill_engine import LanguagePrefill  # noqa: E402
from epdctl.runtime.prompt import build_prompt  # noqa: E402
from epdctl.runtime.sampling import SamplingParams  # noqa: E402
from epdctl.shapes import make_request  # noqa: E402


def prefills(bundle: Any, n: int, params: SamplingParams) -> list:
    """``n`` prefilled requests with 1..8 images (different prompt lengths)."""
    enc, pre, out = VisionEncoder(bundle, cache_mb=0), LanguagePrefill(bundle), []
    for i in range(n):
        images = 1 + i % 8
        pngs, question, _ = make_request(random.Random(i), images, plain=True)
        messages = [{"role": "user", "content": [{"type": "image"}] * images + [{"type": "text", "text": question}]}]
        encoded = enc.encode(pngs)
        prompt = build_prompt(bundle, messages, [e.grid_thw for e in encoded])
        out.append(pre.prefill(prompt, encoded, params))
    return out


MODES = {"greedy": False, "greedy, joining": True, "sampled": False}  # mode: streams join one per step


def stream_params(mode: str, tokens: int, i: int) -> SamplingParams:
    if mode == "sampled":
        return SamplingParams(max_tokens=tokens, temperature=0.8, top_p=0.95, seed=i, ignore_eos=True)
    return SamplingParams(max_tokens=tokens, ignore_eos=True)


def run(bundle: Any, results: list, mode: str, tokens_each: int) -> dict:
    """Decode every result to completion; joining: one joins per step instead of all at once.
    Times the whole run and, apart, its first (join) step."""
    engine = DecodeEngine(bundle, max_running=len(results))
    pending = [(i, r, stream_params(mode, tokens_each, i)) for i, r in enumerate(results)]
    if not MODES[mode]:
        for i, r, params in pending:
            engine.add(f"s{i}", r, params)
        pending = []
    tokens, steps, join = 0, 0, 0.0
    t0, c0 = time.perf_counter(), time.thread_time()
    while engine.num_running or pending:
        if pending:
            i, r, params = pending.pop(0)
            engine.add(f"s{i}", r, params)
        tokens += len(engine.step())
        steps += 1
        if steps == 1:
            join = time.perf_counter() - t0
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    return {"tokens": tokens, "steps": steps, "wall_s": wall, "cpu_s": cpu, "join_s": join}


def pooled(runs: list[dict]) -> dict:
    """Runs one after another as one: tokens/s, tokens per CPU-s, join and steady ms per step."""
    tokens, wall, cpu, join, steps = (sum(r[k] for r in runs) for k in ("tokens", "wall_s", "cpu_s", "join_s", "steps"))
    return {"tokens_per_s": tokens / wall, "tokens_per_cpu_s": tokens / cpu, "join_ms": join / len(runs) * 1e3,
            "steady_ms": (wall - join) / (steps - len(runs)) * 1e3}


def summary(turns: list[tuple[dict, dict]], n: int) -> dict:
    """Best (least time) and median over the turns of (batched, alone) pairs."""
    def pick(side: int, key: str, best: Any) -> tuple[float, float]:
        vals = [t[side][key] for t in turns]
        return best(vals), statistics.median(vals)

    out: dict[str, Any] = {"turns": len(turns)}
    for side, name in ((0, "batched"), (1, "alone")):
        out[f"{name}_tokens_per_s"], out[f"{name}_tokens_per_s_median"] = pick(side, "tokens_per_s", max)
        out[f"{name}_tokens_per_cpu_s"], _ = pick(side, "tokens_per_cpu_s", max)
        out[f"{name}_steady_ms"], out[f"{name}_steady_ms_median"] = pick(side, "steady_ms", min)
        out[f"{name}_join_ms"], _ = pick(side, "join_ms", min)
    out["x_least"] = out["batched_tokens_per_s"] / out["alone_tokens_per_s"]
    out["x_median"] = out["batched_tokens_per_s_median"] / out["alone_tokens_per_s_median"]
    out["x_cpu"] = out["batched_tokens_per_cpu_s"] / out["alone_tokens_per_cpu_s"]
    out["x_turns_median"] = statistics.median(b["tokens_per_s"] / a["tokens_per_s"] for b, a in turns)
    out["x_steady_least"] = n * out["alone_steady_ms"] / out["batched_steady_ms"]
    out["x_steady_median"] = n * out["alone_steady_ms_median"] / out["batched_steady_ms_median"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="checkpoint folder (default: models/tiny-qwen2vl, else a random tiny one)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5, help="turns: each runs both sides of every row")
    ap.add_argument("--streams", type=int, nargs="+", default=[4, 16], help="batch sizes (1 = the baseline, implied)")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's, one per core)")
    ap.add_argument("--dtype", default="float32", help="the model's dtype (bfloat16: the runtime's module path)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "decode_batch.json"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = sorted({n for n in args.streams if n > 1})
    path, source = model_dir(args.model)
    bundle = load_bundle(path, role="colocated", dtype=args.dtype)
    results = prefills(bundle, max(sizes), SamplingParams(max_tokens=args.tokens, ignore_eos=True))
    turns: dict[tuple[str, int], list[tuple[dict, dict]]] = {(m, n): [] for m in args.modes for n in sizes}
    load0 = os.getloadavg()[0]
    for turn in range(args.reps):
        alone_runs: dict[str, list[dict]] = {}
        for mode in args.modes:
            base = "greedy" if MODES[mode] else mode  # joining alone is the greedy run
            if turn % 2 and base not in alone_runs:  # odd turns: the 1-stream side first
                alone_runs[base] = [run(bundle, [r], base, args.tokens) for r in results]
            batched = {n: pooled([run(bundle, results[:n], mode, args.tokens)]) for n in sizes}
            if base not in alone_runs:
                alone_runs[base] = [run(bundle, [r], base, args.tokens) for r in results]
            for n in sizes:
                turns[mode, n].append((batched[n], pooled(alone_runs[base][:n])))
    load1 = os.getloadavg()[0]
    rows = [{"mode": m, "streams": n, **summary(turns[m, n], n)} for m in args.modes for n in sizes]
    print(f"{'mode':>16} {'n':>3} {'alone tok/s':>12} {'batched':>8} {'x least':>8} {'x median':>8} {'x turns':>7} "
          f"{'x CPU':>6} "
          f"{'steady ms alone':>15} {'batched':>8} {'x least':>8} {'x median':>8} {'join ms':>8}")
    for r in rows:
        print(f"{r['mode']:>16} {r['streams']:3d} {r['alone_tokens_per_s']:12.0f} {r['batched_tokens_per_s']:8.0f} "
              f"{r['x_least']:8.2f} {r['x_median']:8.2f} {r['x_turns_median']:7.2f} {r['x_cpu']:6.2f} "
              f"{r['alone_steady_ms']:15.3f} "
              f"{r['batched_steady_ms']:8.3f} {r['x_steady_least']:8.2f} {r['x_steady_median']:8.2f} "
              f"{r['batched_join_ms']:8.2f}")
    print(f"threads {torch.get_num_threads()}, load {load0:.2f} -> {load1:.2f}; {args.reps} turns, both sides of every "
          "row in each; alone = the same requests decoded one at a time; x = batched tokens/s over alone's (least "
          "times, medians, the median of each turn's own ratio, CPU time); steady = steps after the join step (ab_decode_step.py's measure)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": source, "dtype": args.dtype, "tokens": args.tokens, "reps": args.reps,
                               "threads": torch.get_num_threads(), "load_avg_1m": [load0, load1],
                               "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
