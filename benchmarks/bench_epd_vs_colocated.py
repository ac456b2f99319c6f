"""EPD (encoder/prefill/decode split) versus colocated serving on the same cores.

Both topologies are started with `epdctl up` and stay up side by side (their ports differ; the
idle one sleeps). The same multi-image workload (4-8 images per request, ~30% of images repeated
from earlier requests, open-loop Poisson arrivals) is replayed through each router with
`epdctl bench`'s own load generator, in ROUNDS that alternate which mode goes first; every round
uses a new seed and the same requests for both modes. The machine's load swings minute to minute,
so the ratio is reported per round (min / median / max) as well as over all requests, with the
load average at each round. Per mode: TTFT p50/p99, TPOT p50/p99, throughput, errors, and where
the time to first token goes (epd_stages.py: the workers' own stamps, stage by stage).
Router overhead (router_overhead.py): real workers paired, and smg in front of instant dummies.

Measured, not asserted. Usage:
    .venv/bin/python benchmarks/bench_epd_vs_colocated.py [--requests 48] [--rounds 6] [--rate 0.5]
Writes benchmarks/results/epd_vs_colocated.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from epd_stages import breakdown, by_images, format_breakdown  # noqa: E402
from router_overhead import dummy_router_overhead, router_overhead  # noqa: E402

from epdctl.bench import client, report  # noqa: E402
from epdctl.bench.client import Sample, Target  # noqa: E402
from epdctl.bench.workload import Workload, parse_images  # noqa: E402


def summarize(samples: list, wall: float) -> dict:
    """The fields this comparison prints, from `epdctl bench`'s own report."""
    r = report.summarize(samples, wall)
    return {
        "requests": r["requests"], "ok": r["ok"], "errors": r["first_errors"],
        "ttft_p50_ms": r["ttft_ms"]["p50"], "ttft_p99_ms": r["ttft_ms"]["p99"],
        "tpot_p50_ms": r["tpot_ms"]["p50"], "tpot_p99_ms": r["tpot_ms"]["p99"],
        "latency_p50_ms": r["latency_ms"]["p50"],
        "req_per_s": r["throughput"]["requests_per_s"],
        "tok_per_s": r["throughput"]["output_tokens_per_s"],
        "images_per_s": r["throughput"]["images_per_s"], "wall_s": r["wall_s"],
    }


def median_ttft(samples: list[Sample]) -> float | None:
    xs = [s.ttft for s in samples if s.ok and s.ttft is not None]
    return statistics.median(xs) * 1000.0 if xs else None


def epdctl(*args: str, env: dict) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "epdctl", *args]
    print("$ epdctl " + " ".join(args), flush=True)
    return subprocess.run(cmd, env=env, cwd=ROOT, text=True, capture_output=True)


def plan_info(topology: Path) -> dict:
    """Router URL, model name and worker URLs, from epdctl's own plan."""
    from epdctl.render import build_plan
    from epdctl.topology import load_topology

    topo = load_topology(topology)
    plan = build_plan(topo)
    info: dict = {"name": topo.name, "model": topo.model.served_name, "router": plan.router.url,
                  "topology": str(topology)}
    for w in plan.workers:
        if w.role == "colocated":
            info.setdefault("colocated", w.url)
        if w.role == "prefill" and w.is_leader:
            info.setdefault("prefill", w.url)
            info.setdefault("bootstrap_host", w.host)
            info.setdefault("bootstrap_port", w.bootstrap_port)
        if w.role == "decode" and w.is_leader:
            info.setdefault("decode", w.url)
    info["mode"] = "colocated" if "colocated" in info else "epd"
    return info


def rounds(infos: dict[str, dict], work: Workload, n_rounds: int) -> tuple[dict, list[dict]]:
    """Run the workload in rounds, alternating which mode goes first; samples per mode, per round."""
    per_round = max(1, work.requests // n_rounds)
    samples: dict[str, list[Sample]] = {m: [] for m in infos}
    walls = {m: 0.0 for m in infos}
    table = []
    for r in range(n_rounds):
        order = list(infos) if r % 2 == 0 else list(reversed(list(infos)))
        row: dict = {"round": r + 1, "first": order[0], "load_avg_1m": round(os.getloadavg()[0], 2)}
        for mode in order:
            target = Target(infos[mode]["router"], infos[mode]["model"])
            got, wall = client.run(target, work.with_(requests=per_round, seed=work.seed + 1000 * r))
            samples[mode] += got
            walls[mode] += wall
            row[f"{mode}_ttft_p50_ms"] = median_ttft(got)
            row[f"{mode}_ok"] = sum(s.ok for s in got)
        if row.get("epd_ttft_p50_ms") and row.get("colocated_ttft_p50_ms"):
            row["ratio"] = round(row["epd_ttft_p50_ms"] / row["colocated_ttft_p50_ms"], 3)
        table.append(row)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                              for k, v in row.items() if k != "round"), flush=True)
    return {m: (samples[m], walls[m]) for m in infos}, table


def run_all(infos: dict[str, dict], work: Workload, args: argparse.Namespace, env: dict) -> dict:
    """Bring every topology up, warm it, run the rounds, measure the router, bring all down."""
    out: dict = {}
    started = []
    try:
        for mode, info in infos.items():
            up = epdctl("up", info["topology"], "--no-canary", "--timeout", str(args.timeout), env=env)
            if up.returncode != 0:
                return {mode: {"topology": info["topology"], "error": (up.stdout + up.stderr)[-2000:]}}
            started.append(info["name"])
        for mode, info in infos.items():  # both encoders' and the engines' first calls out of the way
            client.run(Target(info["router"], info["model"]),
                       replace(work, images={4: 1.0}, requests=4, max_tokens=4, seed=work.seed + 7, rate=None,
                               concurrency=1))
        by_mode, table = rounds(infos, work, args.rounds)
        for mode, (samples, wall) in by_mode.items():
            out[mode] = {"topology": infos[mode]["topology"], **summarize(samples, wall),
                         "stages_p50_ms": breakdown(samples), "stages_p50_ms_by_images": by_images(samples)}
        out["rounds"] = table
        for mode, info in infos.items():
            out[mode]["router_overhead"] = router_overhead(info["router"], info, info["model"],
                                                           args.overhead_n, args.seed)
        return out
    finally:
        for name in started:
            epdctl("down", name, env=env)


def shifted_copy(src: Path, offset: int, tmp: Path) -> Path:
    """A copy of ``src`` with every port-like integer moved by ``offset`` and paths absolute."""
    import yaml

    def walk(d, key: str = ""):
        if isinstance(d, dict):
            return {k: walk(v, str(k)) for k, v in d.items()}
        if isinstance(d, list):
            return [walk(v, key) for v in d]
        if isinstance(d, int) and ("port" in key or key in ("base", "limit")) and d > 1024:
            return d + offset
        return d

    doc = walk(yaml.safe_load(src.read_text()))
    model = doc.get("model") or {}
    if isinstance(model.get("path"), str) and not Path(model["path"]).is_absolute():
        model["path"] = str((src.parent / model["path"]).resolve())
    out = tmp / src.name
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epd", type=Path, default=ROOT / "topologies/local.yaml")
    ap.add_argument("--colocated", type=Path, default=ROOT / "topologies/local-colocated.yaml")
    ap.add_argument("--requests", type=int, default=48, help="per mode, over all rounds")
    ap.add_argument("--rounds", type=int, default=6, help="rounds alternating which mode goes first")
    ap.add_argument("--rate", type=float, default=0.5, help="Poisson arrivals per second")
    ap.add_argument("--min-images", type=int, default=4)
    ap.add_argument("--max-images", type=int, default=8)
    ap.add_argument("--repeat", type=float, default=0.3, help="fraction of repeated images")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--overhead-n", type=int, default=10)
    ap.add_argument("--dummy-n", type=int, default=200,
                    help="requests for the router-overhead run against instant dummy workers")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port-offset", type=int, default=0,
                    help="move every topology port by this much (e.g. to stay clear of a "
                         "running cluster)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/epd_vs_colocated.json")
    args = ap.parse_args()

    work = Workload(name="epd-vs-colocated", repeat=args.repeat, max_tokens=args.max_tokens,
                    rate=args.rate, requests=args.requests, seed=args.seed,
                    images=parse_images(f"{args.min_images}-{args.max_images}"))
    per_round = max(1, args.requests // args.rounds)
    n_img = per_round * args.rounds * work.mean_images
    tmp = Path(tempfile.mkdtemp(prefix="epdctl-bench-"))
    env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp / "state"))
    if args.port_offset:
        args.epd = shifted_copy(args.epd, args.port_offset, tmp)
        args.colocated = shifted_copy(args.colocated, args.port_offset, tmp)
    infos = {"epd": plan_info(args.epd), "colocated": plan_info(args.colocated)}
    load_start = os.getloadavg()
    measured = run_all(infos, work, args, env)
    results = {
        "workload": {"requests_per_mode": per_round * args.rounds, "rounds": args.rounds,
                     "rate_per_s": args.rate, "max_tokens": args.max_tokens,
                     "images_per_request": [args.min_images, args.max_images],
                     "repeat_fraction": args.repeat, "seed": args.seed},
        "command": " ".join(sys.argv),
        "machine": {"cpus": os.cpu_count(), "load_avg_at_start": load_start,
                    "load_avg_at_end": os.getloadavg()},
        **measured,
        "router_overhead_dummy_workers": dummy_router_overhead(args.dummy_n,
                                                               34900 + args.port_offset % 50),
    }
    ratios = [r["ratio"] for r in results.get("rounds", []) if "ratio" in r]
    e, c = results.get("epd", {}), results.get("colocated", {})
    if e.get("ttft_p50_ms") and c.get("ttft_p50_ms"):
        results["ttft_p50_ratio"] = round(e["ttft_p50_ms"] / c["ttft_p50_ms"], 3)
    if ratios:
        results["round_ratio"] = {"min": min(ratios), "median": round(statistics.median(ratios), 3),
                                  "max": max(ratios)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    report_lines(results, per_round * args.rounds, n_img, args)
    print(f"wrote {args.out}")


def report_lines(results: dict, n_req: int, n_img: float, args: argparse.Namespace) -> None:
    keys = ["ok", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "latency_p50_ms",
            "req_per_s", "tok_per_s", "images_per_s"]
    e, c = results.get("epd", {}), results.get("colocated", {})
    print(f"\n{n_req} requests per mode in {args.rounds} rounds (~{n_img:.0f} images), "
          f"{args.rate}/s arrivals, max_tokens {args.max_tokens}; load average "
          f"{results['machine']['load_avg_at_start'][0]:.2f} at start, "
          f"{results['machine']['load_avg_at_end'][0]:.2f} at end")
    print(f"{'metric':<16}{'EPD':>12}{'colocated':>12}")
    for k in keys:
        print(f"{k:<16}{str(e.get(k, '-')):>12}{str(c.get(k, '-')):>12}")
    if "ttft_p50_ratio" in results:
        rr = results.get("round_ratio", {})
        print(f"TTFT p50 EPD / colocated: {results['ttft_p50_ratio']} over all requests; per round "
              f"min {rr.get('min')} median {rr.get('median')} max {rr.get('max')}")
    if e.get("stages_p50_ms") or c.get("stages_p50_ms"):
        print("\n".join(format_breakdown(e.get("stages_p50_ms", {}), c.get("stages_p50_ms", {}))))
        eb, cb = e.get("stages_p50_ms_by_images", {}), c.get("stages_p50_ms_by_images", {})
        for n in sorted(set(eb) & set(cb), key=int):
            print(f"{n} images: worker TTFT p50 EPD {eb[n].get('worker ttft')} ms (n={int(eb[n].get('n', 0))}), "
                  f"colocated {cb[n].get('worker ttft')} ms (n={int(cb[n].get('n', 0))})")
    for mode in ("epd", "colocated"):
        ro = results.get(mode, {}).get("router_overhead")
        if ro:
            print(f"router overhead, real workers ({mode}): via router {ro['via_router_p50_ms']} "
                  f"ms, direct {ro['direct_p50_ms']} ms, paired difference p50 "
                  f"{ro['router_added_p50_ms']} ms (n={ro['n']})")
        if "error" in results.get(mode, {}):
            print(f"{mode}: FAILED\n{results[mode]['error']}")
    ro = results["router_overhead_dummy_workers"]
    print(f"router overhead, instant dummy workers: via router {ro['via_router_p50_ms']} ms, "
          f"direct {ro['direct_p50_ms']} ms, added p50 {ro['router_added_p50_ms']} ms, "
          f"p99 {ro['router_added_p99_ms']} ms (n={ro['n']})")


if __name__ == "__main__":
    main()
