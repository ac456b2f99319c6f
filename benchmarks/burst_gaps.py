"""Where a decode's long token gaps come from: the client's stamps against the decode's timeline.

Reads what ``bench_burst_isolation.py --trace DIR`` wrote (``<mode>-client.json``: every streamed
token's arrival at the client; ``<mode>-decode.json`` or ``<mode>-colocated.json``: the worker's
engine steps, engine commands, slow event-loop callbacks and collections, loop_trace.py; all on
the host's monotonic clock). For every client gap of ``--over`` ms or more: its kind (the first gap of an answer waits for
the KV and its join; a gap spanning several engine steps is a token held back or delivered
late; a one-step gap is a slow step or a slow way out), and for one-step gaps a split: the
step's CPU time, its waiting (wall - CPU: the GIL or a core), engine commands and idle time
before it, and its end to the client (event loop, SSE write, router, client). It also lists the
slow event-loop callbacks that overlapped the long gaps, with their wall and CPU time.

Usage: benchmarks/burst_gaps.py DIR [--mode epd] [--over 4]
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
from collections import defaultdict
from pathlib import Path


def analyse(client: dict, trace: dict, over_s: float) -> dict:
    steps = sorted(tuple(s) for s in trace["steps"])
    ends = [s[1] for s in steps]
    cmds = sorted(tuple(c) for c in trace["commands"])
    loop = sorted(tuple(e) for e in trace["loop"])
    gcs = sorted(tuple(g) for g in trace["gc"])
    parts: dict[str, float] = defaultdict(float)
    kinds: dict[str, int] = defaultdict(int)
    labels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    examples = []
    total = 0
    for stamps in client["stamps"]:
        for idx, (a, b) in enumerate(zip(stamps, stamps[1:])):
            total += 1
            if b - a < over_s:
                continue
            i = bisect.bisect_left(ends, b) - 1  # the last step that ended before the token arrived
            if i < 1:
                continue
            s0, s1, _, cpu = steps[i]
            prev_end = steps[i - 1][1]
            n_steps = bisect.bisect_left(ends, b) - bisect.bisect_right(ends, a)
            kind = "first (KV join)" if idx == 0 else ("one step" if n_steps <= 1 else "several steps")
            kinds[kind] += 1
            between = sum(min(c1, s0) - max(c0, prev_end) for c0, c1 in cmds if c1 > prev_end and c0 < s0)
            parts["gap"] += b - a
            if kind == "one step":
                parts["one step: step cpu"] += cpu
                parts["one step: step waiting (wall - cpu)"] += (s1 - s0) - cpu
                parts["one step: commands before it"] += max(0.0, between)
                parts["one step: engine idle before it"] += max(0.0, s0 - prev_end - between)
                parts["one step: step end -> client"] += b - s1
                parts["one step: unexplained (token before a)"] += max(0.0, (b - a) - (b - prev_end))
            parts["gc"] += sum(min(g1, b) - max(g0, a) for g0, g1, _ in gcs if g1 > a and g0 < b)
            hit = []
            for t0, t1, lcpu, label in loop:
                if t1 > a and t0 < b:
                    labels[label][0] += 1
                    labels[label][1] += t1 - t0
                    labels[label][2] += lcpu
                    hit.append((round((t1 - t0) * 1000, 2), round(lcpu * 1000, 2), label))
            examples.append({"gap_ms": round((b - a) * 1000, 2), "token": idx + 1, "kind": kind, "steps": n_steps,
                             "step_ms": round((s1 - s0) * 1000, 2), "step_cpu_ms": round(cpu * 1000, 2),
                             "after_ms": round((b - s1) * 1000, 2), "loop": sorted(hit, reverse=True)[:4]})
    top = sorted(labels.items(), key=lambda kv: -kv[1][1])[:12]
    all_loop: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for t0, t1, lcpu, label in loop:
        all_loop[label][0] += 1
        all_loop[label][1] += t1 - t0
        all_loop[label][2] += lcpu
    client_gaps = [b - a for st in client["stamps"] for a, b in zip(st[1:], st[2:])]
    written = [st for st in (trace.get("written") or {}).values() if len(st) >= 20]  # the streams
    decode_gaps = [b - a for st in written for a, b in zip(st[1:], st[2:])]
    deliver = [t1 - t0 for t0, t1 in trace.get("delivered") or []]
    return {"gaps": total,
            "client gaps after the first, ms p50/p99/max": _pcts(client_gaps),
            "decode-side gaps (token taken to be sent), ms p50/p99/max": _pcts(decode_gaps),
            "step end -> tokens on their queues, ms p50/p99/max": _pcts(deliver), "long_gaps": sum(kinds.values()), "kinds": dict(kinds),
            "sum_ms": {k: round(v * 1000, 1) for k, v in parts.items()},
            "loop_in_long_gaps (n, wall ms, cpu ms)": [(k, n, round(t * 1000, 1), round(c * 1000, 1))
                                                      for k, (n, t, c) in top],
            "loop_all (n, wall ms, cpu ms)": sorted(((k, n, round(t * 1000, 1), round(c * 1000, 1))
                                                     for k, (n, t, c) in all_loop.items()), key=lambda x: -x[2])[:12],
            "step_wall_ms_p50_p99_max": _pcts([s[1] - s[0] for s in steps]),
            "step_cpu_ms_p50_p99_max": _pcts([s[3] for s in steps]),
            "command_ms_p50_p99_max": _pcts([c[1] - c[0] for c in cmds]),
            "examples": sorted(examples, key=lambda e: -e["gap_ms"])[:12]}


def _pcts(xs: list[float]) -> list[float]:
    if not xs:
        return []
    xs = sorted(xs)
    return [round(xs[min(len(xs) - 1, max(0, math.ceil(p * len(xs)) - 1))] * 1000, 2) for p in (0.5, 0.99, 1.0)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--mode", default="epd", choices=["epd", "colocated"])
    ap.add_argument("--over", type=float, default=4.0, help="gaps of at least this many ms")
    args = ap.parse_args()
    client = json.loads((args.dir / f"{args.mode}-client.json").read_text())
    worker = "decode" if args.mode == "epd" else "colocated"
    trace = json.loads((args.dir / f"{args.mode}-{worker}.json").read_text())
    out = analyse(client, trace, args.over / 1000)
    examples = out.pop("examples")
    print(json.dumps(out, indent=1))
    for e in examples:
        print(json.dumps(e))


if __name__ == "__main__":
    main()
