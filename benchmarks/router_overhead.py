"""The router's own cost, for bench_epd_vs_colocated.py: real workers and instant dummies.

The same small request sent through the router and straight to the workers (colocated: the
worker itself; EPD: prefill + decode called concurrently with the bootstrap fields the router
would add), interleaved, median difference; and smg in PD mode in front of two dummy workers
that answer at once, which isolates the router.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import random
import tempfile
import time
from pathlib import Path

from epdctl import shapes
from epdctl.canary import build_messages
from epdctl.http.probes import http as http_call

ROOT = Path(__file__).resolve().parent.parent


def pct(xs: list[float], p: float) -> float | None:
    """Nearest-rank percentile in milliseconds."""
    if not xs:
        return None
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, math.ceil(p / 100 * len(xs)) - 1))
    return round(xs[k] * 1000, 1)


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
    from epdctl.http.routerctl import RouterClient, with_local_health_flags
    from epdctl.state.store import ProcessRecord

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
