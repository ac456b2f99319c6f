"""`rebalance --auto --apply` on a live cluster whose load changes shape: the timeline.

Starts a 1-encoder / 1-prefill / 2-decode embedded cluster (switchable: the default)
(ports 38500-38599, state in a temp dir), runs ``--clients`` request loops through the router
(images-heavy: ``--images`` fresh images per request and 8 output tokens; then text-only: no
image, ``--text-tokens`` output tokens) and, beside them, `epdctl rebalance --auto --apply`
(``--interval``, ``--window``, ``--busy-high``, ``--sustain``, ``--cooldown``, its per-sample JSON
log). Prints and writes
(benchmarks/results/rebalance_auto.json) the timeline: each phase with the mean per-role signals
the policy saw (utilisation = busy seconds per second per worker, own queue per worker) and
p50/p99 latency and failures, and each move the policy made (when, direction, path, out of
service). Measured, not asserted; the host's load (`uptime`) is recorded with the figures.

    flock /tmp/epdctl-heavy.lock nice -n 10 .venv/bin/python benchmarks/bench_rebalance_auto.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness import Harness, switchable_layout  # noqa: E402
from epdctl.bench.phases import Phase, PhasedLoad  # noqa: E402

BASE = 38500
ROLES = ("encoder", "prefill", "decode")


def topology(h: Harness, name: str, base: int) -> Path:
    doc = switchable_layout(base)
    return h.topology(doc, name)


def _mean(xs: list[float]) -> float | None:
    return round(statistics.mean(xs), 2) if xs else None


def segment(load: PhasedLoad, samples: list[dict[str, Any]], name: str, a: float, b: float
            ) -> dict[str, Any]:
    """One stretch of one layout under one phase: what the policy saw and what clients got."""
    inside = [s for s in samples if a <= s["t"] < b]
    per_worker = lambda s, key, r: s[key].get(r, 0.0) / max(1, s["counts"][r])  # noqa: E731
    return {"phase": name, "from_s": round(a - load.started, 1),
            "to_s": round(b - load.started, 1),
            "layout": ("/".join(f"{inside[0]['counts'][r]}{r[0].upper()}" for r in ROLES)
                       if inside else None),
            "utilisation": {r: _mean([s["util"][r] for s in inside if r in s["util"]])
                            for r in ROLES},
            "own_queue_per_worker": {r: _mean([per_worker(s, "queue", r) for s in inside])
                                     for r in ROLES},
            "v1_loads_per_worker": {r: _mean([per_worker(s, "loads", r) for s in inside])
                                    for r in ROLES},
            **load.summary(a, b)}


def timeline(load: PhasedLoad, samples: list[dict[str, Any]], history: list[dict[str, Any]]
             ) -> dict[str, Any]:
    """Phases cut at every move: per stretch the layout, mean signals, latency and failures;
    per move when, what, which path, why and how long."""
    t0 = load.started
    cuts = sorted(rec["finished"] for rec in history)
    stretches = []
    for name, a, b in load.bounds():
        edges = [a, *[c for c in cuts if a < c < b], b]
        stretches += [segment(load, samples, name, x, y) for x, y in zip(edges, edges[1:])]
    moves = []
    for rec in history:
        for m in rec["moves"]:
            steps = m.get("steps", {})
            at = rec["started"]
            phase = load.phase_at(at)
            moves.append({"at_s": round(at - t0, 1), "phase": phase.name if phase else "after",
                          "move": f"{m['move']['worker']} ({m['move']['old_role']}) -> "
                                  f"{m['move']['new_name']} ({m['move']['new_role']})",
                          "outcome": m["outcome"], "path": m.get("taken"),
                          "reason": rec.get("request", {}).get("reason"),
                          "out_of_service_s": round(sum(v for k, v in steps.items()
                                                        if k != "verify"), 2),
                          "steps_s": steps})
    return {"timeline": stretches, "moves": moves,
            "phases": [{"phase": n, **load.summary(a, b)} for n, a, b in load.bounds()],
            "failed": sum(not r.ok for r in load.records), "requests": len(load.records),
            "errors": sorted({r.error for r in load.records if not r.ok})[:5]}


def table(report: dict[str, Any]) -> str:
    """The timeline as the markdown table docs/rebalance.md carries."""
    rows = ["| from-to (s) | load | layout E/P/D | busy E / P / D | /v1/loads P / D | own queue "
            "E / P / D | requests | failed | p50 | p99 |", "|" + "---|" * 10]
    f = lambda d: " / ".join("-" if d[r] is None else f"{d[r]:.2f}" for r in ROLES)  # noqa: E731
    for s in report["timeline"]:
        loads = s["v1_loads_per_worker"]
        rows.append(f"| {s['from_s']:.0f}-{s['to_s']:.0f} | {s['phase']} | {s['layout']} | "
                    f"{f(s['utilisation'])} | {loads['prefill']} / {loads['decode']} | "
                    f"{f(s['own_queue_per_worker'])} | {s['requests']} | {s['failed']} | "
                    f"{s['p50_s']} s | {s['p99_s']} s |")
    rows.append("")
    for m in report["moves"]:
        rows.append(f"- {m['at_s']:.0f} s ({m['phase']}): {m['move']}, {m['path']}, "
                    f"{m['outcome']}, out of service {m['out_of_service_s']} s; {m['reason']}")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--images", type=int, default=16, help="images per images-heavy request")
    ap.add_argument("--text-tokens", type=int, default=64)
    ap.add_argument("--phase", type=float, default=60.0, help="seconds per load phase")
    ap.add_argument("--phases", default="images,text", help="comma-separated phase names")
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--window", type=float, default=6.0)
    ap.add_argument("--busy-high", type=float, default=0.7)
    ap.add_argument("--sustain", type=int, default=3)
    ap.add_argument("--cooldown", type=float, default=20.0)
    ap.add_argument("--base", type=int, default=BASE)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "rebalance_auto.json")
    args = ap.parse_args()
    h = Harness("bench-rb-auto-")
    name = "bench-rb-auto"
    path = topology(h, name, args.base)
    h.epdctl("up", str(path), "--no-canary", "--timeout", "600")
    from epdctl.render import build_plan
    from epdctl.topology import load_topology

    router = build_plan(load_topology(path)).router.url
    phases = [Phase(p, args.phase, images=args.images, max_tokens=8 if p == "images" else args.text_tokens)
              for p in args.phases.split(",")]
    load = PhasedLoad(router, phases, clients=args.clients)
    log = h.tmp / "auto.jsonl"
    total = sum(p.seconds for p in phases)
    auto = None
    uptime = []
    try:
        load.start()
        auto = subprocess.Popen(
            [sys.executable, "-m", "epdctl", "rebalance", name, "--auto", "--apply",
             "--interval", str(args.interval), "--window", str(args.window),
             "--busy-high", str(args.busy_high), "--sustain", str(args.sustain),
             "--cooldown", str(args.cooldown), "--iterations", str(int(total / args.interval)),
             "--log-json", str(log)],
            env=h.env, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in phases:
            time.sleep(phases[0].seconds / 2)
            uptime.append(os.getloadavg()[0])
            time.sleep(phases[0].seconds / 2)
        load.join()
        out, _ = auto.communicate(timeout=300)
    finally:
        load.stop.set()
        if auto is not None and auto.poll() is None:
            auto.terminate()
            auto.wait(30)
        hist = [json.loads(ln) for ln in h.epdctl("history", name, "--json", check=False
                                                  ).stdout.splitlines()]
        h.epdctl("down", name, check=False)
    samples = [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []
    report = {"clients": args.clients, "images_per_request": args.images,
              "text_tokens": args.text_tokens, "interval_s": args.interval,
              "window_s": args.window, "busy_high": args.busy_high,
              "sustain": args.sustain, "cooldown_s": args.cooldown,
              "load_avg_1m": [round(x, 2) for x in uptime], "auto_rc": auto.returncode if auto else None,
              **timeline(load, samples, hist)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(out)
    print(json.dumps(report, indent=2))
    print(table(report))


if __name__ == "__main__":
    main()
