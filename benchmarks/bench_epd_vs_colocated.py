"""EPD (encoder/prefill/decode split) versus colocated serving, and the router's own cost.

One run starts each topology with `epdctl up`, replays the same multi-image workload through its
router (4-8 images per request, ~30% of images repeated from earlier requests, open-loop
arrivals at a fixed rate, a bounded number of requests), then stops it with `epdctl down`.
Reported per mode: TTFT p50/p99, TPOT p50/p99, request and token throughput, errors.
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
import http.client
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from epdctl import shapes  # noqa: E402
from epdctl.canary import build_messages  # noqa: E402
from epdctl.probes import http as http_call  # noqa: E402


@dataclass
class Sample:
    """One streamed request."""

    ok: bool
    ttft: float = 0.0
    tpot: float | None = None
    latency: float = 0.0
    tokens: int = 0
    n_images: int = 0
    error: str = ""


def make_workload(n: int, lo: int, hi: int, repeat: float, seed: int) -> list[list[bytes]]:
    """Image lists per request; each image is, with probability ``repeat``, one seen before."""
    rng = random.Random(seed)
    seen: list[bytes] = []
    out = []
    for _ in range(n):
        imgs = []
        for _ in range(rng.randint(lo, hi)):
            if seen and rng.random() < repeat:
                imgs.append(rng.choice(seen))
            else:
                img, _item = shapes.random_item(rng)
                png = shapes.to_png(img)
                seen.append(png)
                imgs.append(png)
        out.append(imgs)
    return out


def stream_chat(base: str, body: dict, timeout: float = 600.0,
                path: str = "/v1/chat/completions") -> Sample:
    """POST with stream=true; time the first content chunk and the last one.

    Tokens are the server's ``usage.completion_tokens`` (asked for with stream_options) when
    it reports them, else the number of content chunks; TPOT = (last - first) / (tokens - 1).
    """
    u = urlparse(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    t0 = time.perf_counter()
    stamps: list[float] = []
    usage_tokens = None
    try:
        conn.request("POST", path, json.dumps({**body, "stream": True,
                                               "stream_options": {"include_usage": True}}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return Sample(False, error=f"HTTP {resp.status}: {resp.read()[:200]!r}")
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if isinstance(chunk.get("usage"), dict):
                usage_tokens = chunk["usage"].get("completion_tokens") or usage_tokens
            for ch in chunk.get("choices") or []:
                if (ch.get("delta") or {}).get("content"):
                    stamps.append(time.perf_counter())
    except (OSError, ValueError, http.client.HTTPException) as e:
        return Sample(False, error=str(e))
    finally:
        conn.close()
    end = time.perf_counter()
    if not stamps:
        return Sample(False, latency=end - t0, error="no content chunk")
    tokens = int(usage_tokens or len(stamps))
    tpot = (stamps[-1] - stamps[0]) / (tokens - 1) if tokens > 1 and len(stamps) > 1 else None
    return Sample(True, ttft=stamps[0] - t0, tpot=tpot, latency=end - t0, tokens=tokens)


def run_load(router: str, model: str, work: list[list[bytes]], rate: float,
             max_tokens: int) -> tuple[list[Sample], float]:
    """Open-loop arrivals every 1/rate seconds; returns samples and wall time."""
    q = shapes.question()
    results: list[Sample] = [Sample(False)] * len(work)
    t0 = time.perf_counter()

    def one(i: int) -> None:
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        body = {"model": model, "messages": build_messages(work[i], q),
                "max_tokens": max_tokens, "temperature": 0.0}
        s = stream_chat(router, body)
        s.n_images = len(work[i])
        results[i] = s

    with cf.ThreadPoolExecutor(max_workers=len(work)) as pool:
        list(pool.map(one, range(len(work))))
    return results, time.perf_counter() - t0


def pct(xs: list[float], p: float) -> float | None:
    """Nearest-rank percentile in milliseconds."""
    if not xs:
        return None
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, math.ceil(p / 100 * len(xs)) - 1))
    return round(xs[k] * 1000, 1)


def summarize(samples: list[Sample], wall: float) -> dict:
    ok = [s for s in samples if s.ok]
    ttft = [s.ttft for s in ok]
    tpot = [s.tpot for s in ok if s.tpot is not None]
    return {
        "requests": len(samples), "ok": len(ok), "errors": [s.error for s in samples if not s.ok],
        "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
        "tpot_p50_ms": pct(tpot, 50), "tpot_p99_ms": pct(tpot, 99),
        "latency_p50_ms": pct([s.latency for s in ok], 50),
        "req_per_s": round(len(ok) / wall, 3), "tok_per_s": round(sum(s.tokens for s in ok) / wall, 2),
        "images_per_s": round(sum(s.n_images for s in ok) / wall, 2), "wall_s": round(wall, 1),
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
    from epdctl.launchers.base import LaunchSpec
    from epdctl.launchers.local import LocalLauncher
    from epdctl.routerctl import RouterClient, with_local_health_flags

    dummy = str(ROOT / "tests" / "e2e" / "dummy_worker.py")
    lau = LocalLauncher()
    logs = Path(tempfile.mkdtemp(prefix="epdctl-bench-dummy-"))
    pre, dec, boot, rport, mport = base + 1, base + 2, base + 3, base, base + 4
    specs = [
        LaunchSpec("prefill-0", "prefill", "local",
                   ("python", dummy, str(pre), "prefill", "--bootstrap-port", str(boot))),
        LaunchSpec("decode-0", "decode", "local", ("python", dummy, str(dec), "decode")),
        LaunchSpec("router", "router", "local", tuple(with_local_health_flags([
            "smg", "launch", "--pd-disaggregation", "--host", "127.0.0.1", "--port", str(rport),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(mport),
            "--prefill", f"http://127.0.0.1:{pre}", str(boot),
            "--decode", f"http://127.0.0.1:{dec}"]))),
    ]
    handles = []
    try:
        for sp in specs:
            handles.append(lau.start(sp, logs / f"{sp.name}.log"))
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


def bench_mode(label: str, topology: Path, work: list[list[bytes]], args: argparse.Namespace,
               env: dict) -> dict:
    info = plan_info(topology)
    up = epdctl("up", str(topology), "--no-canary", "--timeout", str(args.timeout), env=env)
    if up.returncode != 0:
        return {"topology": str(topology), "error": (up.stdout + up.stderr)[-2000:]}
    try:
        warm = stream_chat(info["router"], {"model": info["model"], "max_tokens": 4,
                                            "messages": build_messages(work[0][:2], "hi")})
        samples, wall = run_load(info["router"], info["model"], work, args.rate, args.max_tokens)
        out = {"topology": str(topology), "warmup_ok": warm.ok, **summarize(samples, wall)}
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
    ap.add_argument("--rate", type=float, default=0.5, help="arrivals per second")
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

    work = make_workload(args.requests, args.min_images, args.max_images, args.repeat, args.seed)
    n_img = sum(len(w) for w in work)
    n_unique = len({hash(p) for w in work for p in w})
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
