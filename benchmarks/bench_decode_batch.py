"""Decode batching: tokens/s of 1, 4 and 16 concurrent streams in one DecodeEngine, in one run.

Measured, not asserted. Each stream is a real prefill (tiny model, 1-8 images, different prompt
lengths) handed to the engine; every stream runs ``--tokens`` tokens (ignore_eos). Reported:
aggregate tokens/s, time per step (= TPOT of every running stream) and the speed-up over one
stream, by wall time and by the decoding thread's CPU time (``time.thread_time``: with one torch
thread every op runs on it, and a shared host's preemptions, which swing wall-clock figures by
2x here, do not count). A second row per batch lets streams join one at a time while the batch runs (continuous
batching); a third samples (temperature 0.8, top-p 0.95, each stream its own seed) instead of
taking the argmax, which is what most chat clients ask for. Uses models/tiny-qwen2vl when it
holds a checkpoint, else a tiny random one. Writes benchmarks/results/decode_batch.json.

    .venv/bin/python benchmarks/bench_decode_batch.py [--tokens 64] [--reps 3] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_stages import model_dir  # noqa: E402
from epdctl.runtime.decode_engine import DecodeEngine  # noqa: E402
from epdctl.runtime.encoder_engine import VisionEncoder  # noqa: E402
from epdctl.runtime.model import load_bundle  # noqa: E402
from epdctl.runtime.prefill_engine import LanguagePrefill  # noqa: E402
from epdctl.runtime.prompt import build_prompt  # noqa: E402
from epdctl.runtime.sampling import SamplingParams  # noqa: E402
from epdctl.shapes import make_request  # noqa: E402


def prefills(bundle, n: int, params: SamplingParams) -> list:
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


def run(bundle, results: list, mode: str, tokens_each: int) -> dict:
    """Decode every result to completion; joining: one joins per step instead of all at once."""
    engine = DecodeEngine(bundle, max_running=len(results))
    pending = [(i, r, stream_params(mode, tokens_each, i)) for i, r in enumerate(results)]
    if not MODES[mode]:
        for i, r, params in pending:
            engine.add(f"s{i}", r, params)
        pending = []
    tokens, steps = 0, 0
    t0, c0 = time.perf_counter(), time.thread_time()
    while engine.num_running or pending:
        if pending:
            i, r, params = pending.pop(0)
            engine.add(f"s{i}", r, params)
        tokens += len(engine.step())
        steps += 1
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    return {"tokens": tokens, "steps": steps, "wall_s": wall, "tokens_per_s": tokens / wall,
            "ms_per_step": wall / steps * 1e3, "cpu_s": cpu, "tokens_per_cpu_s": tokens / cpu}


def one_at_a_time(bundle, results: list, mode: str, tokens_each: int) -> dict:
    """The same requests decoded alone, one after another: the work a batch of ``len(results)``
    does, served without batching (the 1-stream row is only the first, shortest, request)."""
    runs = [run(bundle, [r], mode, tokens_each) for r in results]
    tokens, wall, cpu = (sum(r[k] for r in runs) for k in ("tokens", "wall_s", "cpu_s"))
    return {"tokens_per_s": tokens / wall, "tokens_per_cpu_s": tokens / cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="checkpoint folder (default: models/tiny-qwen2vl, else a random tiny one)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's, one per core)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "decode_batch.json"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    path, source = model_dir(args.model)
    bundle = load_bundle(path, role="colocated")
    results = prefills(bundle, max(args.streams), SamplingParams(max_tokens=args.tokens, ignore_eos=True))
    best: dict[tuple[str, int], dict] = {}
    alone: dict[tuple[str, int], dict] = {}
    for _ in range(args.reps):  # each repetition runs every row, so a change of load hits all rows
        for mode in MODES:
            for n in args.streams:
                r = run(bundle, results[:n], mode, args.tokens)
                if (mode, n) in best:  # best wall run; least CPU time of any run
                    r["tokens_per_cpu_s"] = max(r["tokens_per_cpu_s"], best[mode, n]["tokens_per_cpu_s"])
                    if r["tokens_per_s"] < best[mode, n]["tokens_per_s"]:
                        best[mode, n]["tokens_per_cpu_s"] = r["tokens_per_cpu_s"]
                        continue
                best[mode, n] = r
            if not MODES[mode]:  # the same requests alone, one after another (best of the repetitions)
                n = max(args.streams)
                a = one_at_a_time(bundle, results[:n], mode, args.tokens)
                if (mode, n) not in alone or a["tokens_per_s"] > alone[mode, n]["tokens_per_s"]:
                    alone[mode, n] = {**a, "tokens_per_cpu_s": max(a["tokens_per_cpu_s"], alone.get(
                        (mode, n), a)["tokens_per_cpu_s"])}
    rows: list[dict] = []
    print(f"{'streams':>7} {'mode':>16} {'tokens/s':>10} {'ms/step':>9} {'x one stream':>13} "
          f"{'tokens/CPU-s':>13} {'x (CPU time)':>13}")
    for mode in MODES:
        for n in args.streams:
            row = best[mode, n]
            one = best[mode, min(args.streams)]
            row.update(streams=n, mode=mode, staggered=MODES[mode],
                       speedup=row["tokens_per_s"] / one["tokens_per_s"],
                       speedup_cpu=row["tokens_per_cpu_s"] / one["tokens_per_cpu_s"])
            rows.append(row)
            print(f"{n:7d} {mode:>16} {row['tokens_per_s']:10.0f} {row['ms_per_step']:9.2f} "
                  f"{row['speedup']:12.1f}x {row['tokens_per_cpu_s']:13.0f} {row['speedup_cpu']:12.1f}x")
    n = max(args.streams)
    for mode in [m for m in MODES if (m, n) in alone]:
        a, b = alone[mode, n], best[mode, n]
        b.update(alone_tokens_per_s=a["tokens_per_s"], alone_tokens_per_cpu_s=a["tokens_per_cpu_s"],
                 speedup_vs_alone=b["tokens_per_s"] / a["tokens_per_s"],
                 speedup_vs_alone_cpu=b["tokens_per_cpu_s"] / a["tokens_per_cpu_s"])
        print(f"{n} streams {mode}: the same {n} requests one at a time {a['tokens_per_s']:.0f} tokens/s "
              f"({a['tokens_per_cpu_s']:.0f}/CPU-s); batched {b['speedup_vs_alone']:.1f}x "
              f"({b['speedup_vs_alone_cpu']:.1f}x by CPU time)")
    print(f"threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}; best of {args.reps} repetitions (the "
          "host is shared); tokens/s counts every stream's tokens; x one stream: against 1 stream of the same mode "
          "(the first, 1-image request; the others hold up to 8 images, so their steps read more KV).")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": source, "tokens": args.tokens, "reps": args.reps,
                               "threads": torch.get_num_threads(), "load_avg_1m": os.getloadavg()[0],
                               "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
