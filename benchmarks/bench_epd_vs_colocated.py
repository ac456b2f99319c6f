"""EPD (encoder/prefill/decode split) versus colocated serving, and the router's own cost.

One run starts each topology with `epdctl up`, replays the same multi-image workload through its
router (4-8 images per request, ~30% of images repeated from earlier requests, open-loop
Poisson arrivals, a bounded number of requests) with `epdctl bench`'s own load generator
(`epdctl.bench`: same seed, same bytes and arrival times in both modes), then stops it with
`epdctl down`. Reported per mode: TTFT p50/p99, TPOT p50/p99, request and token throughput,
errors.
Router overhead: the same small request sent through the router and straight to the workers
(colocated: the worker itself; EPD: prefill + decode called concurrently with the bootstrap
fields the router would add), interleaved, median difference.

Measured, not asserted. Usage:
    .venv/bin/python benchmarks/bench_epd_vs_colocated.py [--requests 24] [--rate 0.5]
Writes benchmarks/results/epd_vs_colocated.json and prints a table.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from epdctl import shapes  # noqa: E402
from epdctl.bench import client, report  # noqa: E402
from epdctl.bench.client import Target  # noqa: E402
from epdctl.bench.workload import RequestSource, Workload, parse_images  # noqa: E402
from epdctl.canary import build_messages  # noqa: E402
from epdctl.probes import http as http_call  # noqa: E402


def pct(xs: list[float], p: float) -> float | None:
    """Nearest-rank percentile in milliseconds."""
    if not xs:
        return None
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, math.ceil(p / 100 * len(xs)) - 1))
    return round(xs[k] * 1000, 1)


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


def _post_json(url: str, body: dict) -> float:
    t0 = time.perf_counter()
    r = http_call("POST", url, body, timeout=300)
    if not r.ok:
        raise RuntimeError(f"{url}: HTTP {r.status} {r.body[:200]!r}")
    return time.perf_counter() - t0


def _overhead_summary(via: list[float], direct: list[float]) -> dict:
    diffs = [v - d for v, d in zip(via, direct)]
    return {"n": len(diffs), "via_router_p50_ms": pct(via, 50), "direct_p50_ms": pct(direct, 50),
            "router_added_p50_ms": pct(diffs, 50), "router_added_p99_ms": pct(diffs, 99)}


def router_overhead(router: str, plan: dict, model: str, n: int, seed: int) -> dict:
    """The same small request through the router and straight to the workers, paired.

    Straight = the colocated worker itself, or (EPD) prefill and decode called concurrently
    with the bootstrap fields the router would add. On a busy machine the worker's own
    variance dominates; `dummy_router_overhead` isolates the router.
    """
    rng = random.Random(seed)
    pngs, q, _ = shapes.make_request(rng, 1, plain=True)
    body = {"model": model, "messages": build_messages(pngs, q), "max_tokens": 1,
            "temperature": 0.0, "stream": False}
    via, direct = [], []
    for _ in range(n):
        via.append(_post_json(router + "/v1/chat/completions", body))
        if plan["mode"] == "colocated":
            direct.append(_post_json(plan["colocated"] + "/v1/chat/completions", body))
        else:
            pd = {**body, "bootstrap_host": plan["bootstrap_host"],
                  "bootstrap_port": plan["bootstrap_port"], "bootstrap_room": rng.getrandbits(63)}
            t0 = time.perf_counter()
            with cf.ThreadPoolExecutor(2) as pool:
                futs = [pool.submit(_post_json, u + "/v1/chat/completions", pd)
                        for u in (plan["prefill"], plan["decode"])]
                [f.result() for f in futs]
            direct.append(time.perf_counter() - t0)
    return _overhead_summary(via, direct)


def dummy_router_overhead(n: int, base: int) -> dict:
    """smg in PD mode in front of two instant dummy workers vs calling the decode dummy.

    The dummies answer in well under a millisecond, so the difference is what smg adds
    (both legs concurrently, response relayed). Uses the same launcher code as `epdctl up`.
    """
    from epdctl.launchers.local import LocalLauncher
    from epdctl.routerctl import RouterClient, with_local_health_flags
    from epdctl.state import ProcessRecord

    dummy = str(ROOT / "tests" / "e2e" / "dummy_worker.py")
    lau = LocalLauncher()
    logs = Path(tempfile.mkdtemp(prefix="epdctl-bench-dummy-"))
    pre, dec, boot, rport, mport = base + 1, base + 2, base + 3, base, base + 4
    specs = [
        ProcessRecord("prefill-0", "prefill", "local",
                      ["python", dummy, str(pre), "prefill", "--bootstrap-port", str(boot)],
                      log=str(logs / "prefill-0.log")),
        ProcessRecord("decode-0", "decode", "local", ["python", dummy, str(dec), "decode"],
                      log=str(logs / "decode-0.log")),
        ProcessRecord("router", "router", "local", with_local_health_flags([
            "smg", "launch", "--pd-disaggregation", "--host", "127.0.0.1", "--port", str(rport),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(mport),
            "--prefill", f"http://127.0.0.1:{pre}", str(boot),
            "--decode", f"http://127.0.0.1:{dec}"]), log=str(logs / "router.log")),
    ]
    handles = specs
    try:
        started = lau.start(specs)
        started.raise_if_failed("starting the dummies")
        for sp in specs:
            sp.handle = started.ok[sp.name]
        RouterClient(f"http://127.0.0.1:{rport}").wait_ready(120)
        body = {"model": "dummy", "max_tokens": 4,
                "messages": [{"role": "user", "content": "hello"}]}
        for _ in range(5):  # warm both paths' connections
            _post_json(f"http://127.0.0.1:{rport}/v1/chat/completions", body)
        via, direct = [], []
        for _ in range(n):
            via.append(_post_json(f"http://127.0.0.1:{rport}/v1/chat/completions", body))
            direct.append(_post_json(f"http://127.0.0.1:{dec}/v1/chat/completions", body))
        return _overhead_summary(via, direct)
    finally:
        lau.stop(handles, grace=15)


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
    info: dict = {"name": topo.name, "model": topo.model.served_name, "router": plan.router.url}
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


def bench_mode(label: str, topology: Path, work: Workload, args: argparse.Namespace,
               env: dict) -> dict:
    info = plan_info(topology)
    up = epdctl("up", str(topology), "--no-canary", "--timeout", str(args.timeout), env=env)
    if up.returncode != 0:
        return {"topology": str(topology), "error": (up.stdout + up.stderr)[-2000:]}
    try:
        target = Target(info["router"], info["model"])
        warm, _ = client.run(target, work.with_(images={2: 1.0}, requests=1, max_tokens=4,
                                                seed=work.seed + 1))
        samples, wall = client.run(target, work)
        out = {"topology": str(topology), "warmup_ok": warm[0].ok, **summarize(samples, wall)}
        out["router_overhead"] = router_overhead(info["router"], info, info["model"],
                                                 args.overhead_n, args.seed)
        return out
    finally:
        epdctl("down", info["name"], env=env)


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
    ap.add_argument("--requests", type=int, default=24)
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
    src = RequestSource(work)
    reqs = [src.next() for _ in range(args.requests)]
    n_img = sum(len(r.pngs) for r in reqs)
    n_unique = len({p for r in reqs for p in r.pngs})
    tmp = Path(tempfile.mkdtemp(prefix="epdctl-bench-"))
    env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp / "state"))
    if args.port_offset:
        args.epd = shifted_copy(args.epd, args.port_offset, tmp)
        args.colocated = shifted_copy(args.colocated, args.port_offset, tmp)
    results = {
        "workload": {"requests": args.requests, "rate_per_s": args.rate, "images": n_img,
                     "unique_images": n_unique, "max_tokens": args.max_tokens,
                     "images_per_request": [args.min_images, args.max_images],
                     "repeat_fraction": args.repeat, "seed": args.seed},
        "command": " ".join(sys.argv),
        "machine": {"cpus": os.cpu_count(), "load_avg_at_start": os.getloadavg()},
        "epd": bench_mode("epd", args.epd, work, args, env),
        "colocated": bench_mode("colocated", args.colocated, work, args, env),
        "router_overhead_dummy_workers": dummy_router_overhead(args.dummy_n,
                                                               34900 + args.port_offset % 50),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    keys = ["ok", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "latency_p50_ms",
            "req_per_s", "tok_per_s", "images_per_s"]
    print(f"\n{args.requests} requests, {n_img} images ({n_unique} unique), "
          f"{args.rate}/s arrivals, max_tokens {args.max_tokens}")
    print(f"{'metric':<16}{'EPD':>12}{'colocated':>12}")
    for k in keys:
        print(f"{k:<16}{str(results['epd'].get(k, '-')):>12}"
              f"{str(results['colocated'].get(k, '-')):>12}")
    for mode in ("epd", "colocated"):
        ro = results[mode].get("router_overhead")
        if ro:
            print(f"router overhead, real workers ({mode}): via router {ro['via_router_p50_ms']} "
                  f"ms, direct {ro['direct_p50_ms']} ms, paired difference p50 "
                  f"{ro['router_added_p50_ms']} ms (n={ro['n']})")
        if "error" in results[mode]:
            print(f"{mode}: FAILED\n{results[mode]['error']}")
    ro = results["router_overhead_dummy_workers"]
    print(f"router overhead, instant dummy workers: via router {ro['via_router_p50_ms']} ms, "
          f"direct {ro['direct_p50_ms']} ms, added p50 {ro['router_added_p50_ms']} ms, "
          f"p99 {ro['router_added_p99_ms']} ms (n={ro['n']})")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
