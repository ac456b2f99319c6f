"""Why the runtime sets OMP_WAIT_POLICY=PASSIVE: spinning OpenMP threads on a shared CPU host.

torch's CPU build runs intra-op work on libgomp threads, which by default spin for a while after
each parallel region. On one host where every worker is a process (the embedded engine on a
CPU machine) an idle decode's spinning threads take the cores a busy encoder needs. The
runtime sets PASSIVE unless the environment already has the variable, so the topology's node
`env` can set it empty (libgomp then keeps its own default: spin a while, then sleep) for
this comparison. (ACTIVE, spinning for ever, is far worse: TTFT p50 7-13 s vs 50 ms here.)

Starts a copy of topologies/local.yaml (ports 39500-39599, state in a temp dir) with libgomp's
default and with the runtime's PASSIVE, alternately, ``--rounds`` times, and benches each with
the same workload and seed. Prints both side by side and writes
lab/benchmarks/results/omp_wait.json. Measured, not asserted.

    .venv/bin/python lab/benchmarks/bench_omp_wait.py [--rounds 2] [--rate 3] [--requests 60]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.harness import Harness, with_ports_and_env  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rate", type=float, default=3.0)
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--out", type=Path, default=ROOT / "lab" / "benchmarks" / "results" / "omp_wait.json")
    args = ap.parse_args()
    h = Harness("bench-omp-")
    h.env.pop("OMP_WAIT_POLICY", None)
    src = yaml.safe_load((ROOT / "topologies" / "local.yaml").read_text())
    runs: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        for policy in ("DEFAULT", "PASSIVE"):
            # an empty value is "present": the runtime's setdefault leaves libgomp's default
            env = {"OMP_WAIT_POLICY": ""} if policy == "DEFAULT" else None
            name = f"omp-{policy.lower()}"
            path = h.topology(with_ports_and_env(src, 39500, env), name)
            rep = h.bench(path, name, "--images", "6-8", "--repeat", "0.1", "--max-tokens", "32",
                          "--rate", str(args.rate), "--requests", str(args.requests),
                          "--seed", str(rnd))
            row = {"round": rnd, "policy": policy, "ok": rep["ok"], "requests": rep["requests"],
                   "req_s": rep["throughput"]["requests_per_s"],
                   "ttft_ms": {k: rep["ttft_ms"][k] for k in ("p50", "p90", "p99")},
                   "tpot_ms": {k: rep["tpot_ms"][k] for k in ("p50", "p90", "p99")},
                   "encode_p50_ms": (rep["stages_ms"].get("encode_ms") or {}).get("p50")}
            runs.append(row)
            print(f"round {rnd} {policy:7}: TTFT p50/p90/p99 {row['ttft_ms']['p50']:.0f}/"
                  f"{row['ttft_ms']['p90']:.0f}/{row['ttft_ms']['p99']:.0f} ms, TPOT p50/p90 "
                  f"{row['tpot_ms']['p50']:.1f}/{row['tpot_ms']['p90']:.1f} ms, encode p50 "
                  f"{row['encode_p50_ms']} ms, {row['req_s']:.2f} req/s, ok "
                  f"{row['ok']}/{row['requests']}", flush=True)
    summary = {}
    for policy in ("DEFAULT", "PASSIVE"):
        mine = [r for r in runs if r["policy"] == policy]
        summary[policy] = {k: round(statistics.median(r["ttft_ms"][k] for r in mine), 1)
                           for k in ("p50", "p90", "p99")}
    ratio = {k: round(summary["DEFAULT"][k] / summary["PASSIVE"][k], 2) for k in ("p50", "p90", "p99")}
    print(f"TTFT median of rounds, libgomp default {summary['DEFAULT']} vs PASSIVE "
          f"{summary['PASSIVE']}; DEFAULT/PASSIVE {ratio}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rate": args.rate, "requests": args.requests,
                                    "ttft_ms_median": summary, "ratio_default_over_passive": ratio,
                                    "runs": runs}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
