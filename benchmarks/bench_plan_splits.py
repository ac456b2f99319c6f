"""Check an `epdctl plan` recommendation: bench it against every other E:P:D split of the same total.

1. starts the base topology (default: a copy of topologies/local.yaml on ports 39400-39499, state
   in a temp dir), runs `epdctl profile`, stops it;
2. `epdctl plan --json --compare-all` with the workload and SLOs -> the recommended split and the
   predicted TTFT/TPOT of every other split with the same number of workers;
3. for each round, for each split (order rotated per round, so no split always runs first or
   last): writes the topology with those counts, `epdctl up`, `epdctl bench` the workload
   (seed = round), `epdctl down`. One cluster at a time: they share the machine's cores.

Prints predicted vs measured (TTFT mean/p50/p90/p99, TPOT p50, req/s, SLO met) per split and
round, the measured rank of the recommended split each round, and writes
benchmarks/results/plan_splits.json. Measured, not asserted.

    .venv/bin/python benchmarks/bench_plan_splits.py --workload benchmarks/workloads/plan-check.yaml \
        --slo ttft=60ms,tpot=30ms --rounds 3 --also 1:1:1,3:1:1
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

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness import Harness, with_ports_and_env  # noqa: E402
from epdctl.bench.plan_io import retopology  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topology", type=Path, default=ROOT / "topologies" / "local.yaml")
    ap.add_argument("--workload", type=Path, default=ROOT / "benchmarks/workloads/plan-check.yaml")
    ap.add_argument("--slo", default="ttft=60ms,tpot=30ms")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", type=Path, help="use this profile instead of measuring one")
    ap.add_argument("--also", default="", help="other splits to bench for context, e.g. 1:1:1,3:1:1")
    ap.add_argument("--port-base", type=int, default=39400)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads per worker (OMP_NUM_THREADS): 1 = one core per worker, "
                         "like one accelerator per worker; 0 = torch's default")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "plan_splits.json")
    args = ap.parse_args()

    h = Harness("bench-plan-")
    epdctl = h.epdctl
    base = with_ports_and_env(yaml.safe_load(args.topology.read_text()), args.port_base,
                              {"OMP_NUM_THREADS": str(args.threads)} if args.threads else None)

    def write(counts: dict[str, int]) -> tuple[str, Path]:
        name = "split-{encoder}-{prefill}-{decode}".format(**counts)
        return name, h.topology(retopology(base, counts), name, args.topology.parent)

    profile = args.profile
    if profile is None:
        name, path = write({r: base["roles"][r]["count"] for r in ("encoder", "prefill", "decode")})
        epdctl("up", str(path), "--no-canary", "--skip-preflight")
        try:
            profile = h.tmp / "profile.json"
            print(epdctl("profile", name, "--out", str(profile)).stdout)
        finally:
            epdctl("down", name, check=False)
    _, base_path = write({r: base["roles"][r]["count"] for r in ("encoder", "prefill", "decode")})
    plan = json.loads(epdctl("plan", str(base_path), "--workload", str(args.workload),
                             "--profile", str(profile), "--slo", args.slo, "--compare-all",
                             "--json", check=False).stdout)
    peak = plan["peak"]
    print(f"plan: {peak['split']} (feasible={peak['feasible']}), predicted TTFT {peak['ttft_ms']} ms;"
          f" host cores {plan.get('host_cores')}")
    predicted = {peak["split"]: peak, **{c["split"]: c for c in plan["compare"]}}
    same_total = set(predicted)
    extra = [s for s in args.also.split(",") if s and s not in predicted]
    if extra:
        more = json.loads(epdctl("plan", str(base_path), "--workload", str(args.workload),
                                 "--profile", str(profile), "--slo", args.slo, "--json",
                                 *[a for s in extra for a in ("--compare", s)], check=False).stdout)
        predicted.update({c["split"]: c for c in more["compare"]})
    splits = list(predicted)

    runs: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        order = splits[rnd % len(splits):] + splits[:rnd % len(splits)]
        for split in order:
            counts = dict(zip(("encoder", "prefill", "decode"), map(int, split.split(":"))))
            name, path = write(counts)
            t0 = time.time()
            rep = h.bench(path, name, "--workload", str(args.workload), "--seed", str(100 + rnd))
            row = {"round": rnd, "split": split, "ok": rep["ok"], "requests": rep["requests"],
                   "req_s": rep["throughput"]["requests_per_s"],
                   "ttft_ms": {k: rep["ttft_ms"][k] for k in ("mean", "p50", "p90", "p99")},
                   "tpot_p50_ms": rep["tpot_ms"]["p50"], "load_avg": os.getloadavg()[0],
                   "wall_s": round(time.time() - t0, 1)}
            runs.append(row)
            print(f"round {rnd} {split}: TTFT mean {row['ttft_ms']['mean']:.1f} p50 "
                  f"{row['ttft_ms']['p50']:.1f} p90 {row['ttft_ms']['p90']:.1f} p99 "
                  f"{row['ttft_ms']['p99']:.1f} ms, TPOT p50 {row['tpot_p50_ms']:.1f} ms, "
                  f"{row['req_s']:.2f} req/s, ok {row['ok']}/{row['requests']}", flush=True)

    summary = []
    for split in splits:
        mine = [r for r in runs if r["split"] == split]
        med = {k: round(statistics.median(r["ttft_ms"][k] for r in mine), 1)
               for k in ("mean", "p50", "p90", "p99")}
        summary.append({"split": split, "recommended": split == peak["split"],
                        "same_total": split in same_total,
                        "predicted_ttft_ms": predicted[split]["ttft_ms"],
                        "predicted_tpot_ms": predicted[split]["tpot_ms"],
                        "measured_ttft_ms_median_of_rounds": med,
                        "tpot_p50_ms": round(statistics.median(r["tpot_p50_ms"] for r in mine), 2),
                        "req_s": round(statistics.median(r["req_s"] for r in mine), 3)})
    ranks = []
    for rnd in range(args.rounds):
        by_mean = sorted((r for r in runs if r["round"] == rnd and r["split"] in same_total),
                         key=lambda r: r["ttft_ms"]["mean"])
        ranks.append([r["split"] for r in by_mean].index(peak["split"]) + 1)
    doc = {"workload": plan["workload"], "slo": args.slo, "host_cores": plan.get("host_cores"),
           "threads_per_worker": args.threads or None,
           "profile": json.loads(Path(profile).read_text()), "recommended": peak,
           "rank_of_recommended_by_mean_ttft": ranks, "summary": summary, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\n{'split':8} {'pred TTFT':>10} {'TTFT mean':>10} {'p50':>7} {'p90':>7} {'p99':>7} "
          f"{'TPOT':>6} {'req/s':>6}")
    for s in sorted(summary, key=lambda s: s["measured_ttft_ms_median_of_rounds"]["mean"]):
        m = s["measured_ttft_ms_median_of_rounds"]
        print(f"{s['split'] + (' *' if s['recommended'] else ''):8} {s['predicted_ttft_ms'] or 'inf':>10} "
              f"{m['mean']:>10} {m['p50']:>7} {m['p90']:>7} {m['p99']:>7} {s['tpot_p50_ms']:>6} "
              f"{s['req_s']:>6}")
    print(f"rank of the recommended split by mean TTFT among the {len(same_total)} splits of "
          f"its total, per round: {ranks}  (* = recommended)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
