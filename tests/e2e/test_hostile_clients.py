"""Hostile clients against the real local cluster (real smg router, real openai client): every bad
request gets its 4xx, no worker reports it as its own failure, so smg never retries it and its
circuit breaker never opens; good requests interleaved with 1,000 concurrent bad ones all succeed;
and the RSS of every worker stays within the bound docs/limits.md states (RSS_BOUND_MIB).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import random
import http.client
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

import aiohttp
import openai
import psutil
import pytest
from PIL import Image

from epdctl import shapes
from epdctl.render import build_plan
from epdctl.topology import load_topology

if TYPE_CHECKING:
    from conftest import Cluster

RSS_BOUND_MIB = 192      # growth of any worker's RSS over the whole hostile run (docs/limits.md)
N_BAD = 1000
CONCURRENCY = 32


def _png(w: int, h: int) -> str:
    buf = io.BytesIO()
    Image.new("L", (w, h), 200).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _images_msg(urls: list[str], text: str = "What shapes are in the image?") -> list[dict]:
    parts: list[dict] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def _good_request(seed: int) -> tuple[list[dict], list[shapes.Item]]:
    pngs, question, items = shapes.make_request(random.Random(seed), 2, plain=True)
    urls = ["data:image/png;base64," + base64.b64encode(p).decode() for p in pngs]
    return _images_msg(urls, question), items


def _http(method: str, url: str, data: bytes | None = None, body: Any = None,
          timeout: float = 60) -> tuple[int, str]:
    """(status, text) of one request; raw ``data`` or a JSON ``body``."""
    if body is not None:
        data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _post_early_answer(url: str, data: bytes, timeout: float = 120) -> tuple[int, str]:
    """POST a body the server may refuse before reading it: keep the answer when the send breaks off."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.putrequest("POST", u.path)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(data)))
        conn.endheaders()
        try:
            for i in range(0, len(data), 1 << 20):
                conn.send(data[i:i + (1 << 20)])
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before taking the whole body
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


def _rss(cluster: Cluster) -> dict[str, int]:
    """Per recorded process, the RSS of the worker itself: the recorded pid is its supervisor
    (node/supervise.py, ~20 MiB of Python), so its descendants are counted too, except the
    warm spare the supervisor keeps (started with EPDCTL_STANDBY_FD, it serves nothing)."""
    out = {}
    for p in cluster.state()["processes"]:
        try:
            lead = psutil.Process(p["handle"]["pid"])
            tree = [lead, *(q for q in lead.children(recursive=True)
                            if "EPDCTL_STANDBY_FD" not in q.environ())]
            assert len(tree) > 1, f"{p['name']}: supervisor without its worker"
            out[p["name"]] = sum(q.memory_info().rss for q in tree)
        except psutil.NoSuchProcess:
            out[p["name"]] = -1
    return out


def _router_metrics(cluster: Cluster) -> str:
    prom = build_plan(load_topology(cluster.topology)).router
    return _http("GET", f"http://127.0.0.1:{prom.prometheus_port}/metrics")[1]


def _metric_sum(text: str, name: str, must: str = "") -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and must in line and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(scope="module")
def bad_bodies(cluster: Cluster) -> list[tuple[str, dict | bytes]]:
    """(kind, body) for every kind of hostile request; bodies are built once (a 6000x6000 PNG is 70 KB)."""
    m = cluster.model
    big = _png(6000, 6000)
    return [
        ("aspect_1x300", {"model": m, "messages": _images_msg([_png(1, 300)]), "max_tokens": 4}),
        ("16x_6000x6000", {"model": m, "messages": _images_msg([big] * 16), "max_tokens": 4}),
        ("prompt_2MB", {"model": m, "messages": _images_msg([], "lorem ipsum " * 170_000), "max_tokens": 4}),
        ("17_images", {"model": m, "messages": _images_msg([_png(30, 30)] * 17), "max_tokens": 4}),
        ("not_an_image", {"model": m, "messages": _images_msg(["data:image/png;base64,aGVsbG8="]), "max_tokens": 4}),
        ("remote_fetch", {"model": m, "messages": _images_msg(["http://169.254.169.254/latest/meta-data"]),
                          "max_tokens": 4}),
        ("max_tokens_huge", {"model": m, "messages": _images_msg([], "hi"), "max_tokens": 10**6}),
        ("deep_json", b'{"model": "' + m.encode() + b'", "messages": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"),
    ]


async def _send(client: aiohttp.ClientSession, url: str, body: dict | bytes) -> tuple[int, str]:
    kwargs = {"data": body, "headers": {"Content-Type": "application/json"}} if isinstance(body, bytes) \
        else {"json": body}
    async with client.post(url, **kwargs) as r:
        return r.status, (await r.text())[:300]


def test_each_kind_of_bad_request_gets_its_4xx(cluster: Cluster, bad_bodies) -> None:
    """Through the real openai client where it can express the request, raw HTTP for the rest."""
    oa = openai.OpenAI(base_url=cluster.router_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    seen = {}
    for kind, body in bad_bodies:
        if isinstance(body, dict):
            with pytest.raises(openai.APIStatusError) as exc:
                oa.chat.completions.create(**body)
            seen[kind] = (exc.value.status_code, str(exc.value.message)[:200])
        else:
            seen[kind] = _http("POST", cluster.router_url + "/v1/chat/completions", data=body, timeout=120)[0], ""
    print("bad request -> status:", json.dumps(seen, indent=1))
    assert all(400 <= s < 500 for s, _ in seen.values()), seen
    assert "aspect ratio" in seen["aspect_1x300"][1]
    assert "6000x6000" in seen["16x_6000x6000"][1]
    assert "at least" in seen["prompt_2MB"][1]


def test_body_over_the_limit_stops_at_the_router(cluster: Cluster) -> None:
    """limits.max_body_bytes (64 MiB by default) is smg's --max-payload-size: 413 before any worker."""
    limit = load_topology(cluster.topology).limits.max_body_bytes
    body = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * (limit + 1) + b'"}]}'
    status, text = _post_early_answer(cluster.router_url + "/v1/chat/completions", body)
    print("body over the limit ->", status, text[:200])
    assert status == 413, text[:300]


def test_bogus_encoder_registrations_are_refused(cluster: Cluster) -> None:
    prefill = next(p for p in cluster.state()["processes"] if p["role"] == "prefill")
    got = [_http("POST", prefill["url"] + "/register_encoder_url", body={"url": url}, timeout=30)[0]
           for url in ("file:///etc/passwd", "not a url", "http://127.0.0.1:1", "http://169.254.169.254:80")]
    assert got == [400, 400, 400, 400], got
    listing = json.loads(_http("GET", prefill["url"] + "/list_encoder_urls")[1])
    assert len(listing["encoders"]) == 2, listing


def test_unknown_model_is_a_404_in_openais_shape(cluster: Cluster) -> None:
    """smg (--enable-igw) answers a model no worker serves with 404 model_not_found, before any
    worker sees it; the real openai client raises NotFoundError, and the served model still works."""
    oa = openai.OpenAI(base_url=cluster.router_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.NotFoundError) as err:
        oa.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    print("unknown model ->", err.value.status_code, err.value.body)
    assert err.value.status_code == 404 and err.value.code == "model_not_found", err.value.body
    assert "gpt-9" in str(err.value.body)
    ok = oa.chat.completions.create(model=cluster.model, max_tokens=4,
                                    messages=[{"role": "user", "content": "hi"}])
    assert ok.choices[0].message.content is not None


def _warm_up(cluster: Cluster, n: int = 8) -> None:
    """Good requests first: the first prefills of a fresh worker grow its allocator pools (not a leak)."""
    oa = openai.OpenAI(base_url=cluster.router_url + "/v1", api_key="unused", max_retries=0, timeout=300)
    for seed in range(n):
        messages, _ = _good_request(500 + seed)
        oa.chat.completions.create(model=cluster.model, messages=messages, max_tokens=32,
                                   temperature=0)  # type: ignore[arg-type]


def test_1000_concurrent_bad_requests_with_good_ones_interleaved(cluster: Cluster, bad_bodies) -> None:
    _warm_up(cluster)
    rss_before = _rss(cluster)
    metrics_before = _router_metrics(cluster)
    bad_statuses: dict[int, int] = {}
    not_4xx: dict[str, str] = {}  # per kind, the first answer that was not a 4xx (which layer said it)
    good: list[tuple[bool, float]] = []

    async def storm() -> None:
        sem = asyncio.Semaphore(CONCURRENCY)
        url = cluster.router_url + "/v1/chat/completions"
        conn = aiohttp.TCPConnector(limit=CONCURRENCY)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=300)) as client:
            async def one(i: int) -> None:
                async with sem:
                    kind, body = bad_bodies[i % len(bad_bodies)]
                    status, text = await _send(client, url, body)
                    bad_statuses[status] = bad_statuses.get(status, 0) + 1
                    if not 400 <= status < 500:
                        not_4xx.setdefault(kind, f"{status} at {time.monotonic() - t0:.1f} s: {text}")
            await asyncio.gather(*(one(i) for i in range(N_BAD)))

    async def good_loop(stop: asyncio.Event) -> None:
        oa = openai.AsyncOpenAI(base_url=cluster.router_url + "/v1", api_key="unused", max_retries=0, timeout=300)
        seed = 1000
        while not stop.is_set() or len(good) < 5:
            messages, items = _good_request(seed)
            seed += 1
            t0 = time.monotonic()
            resp = await oa.chat.completions.create(model=cluster.model, messages=messages, max_tokens=32,
                                                    temperature=0)  # type: ignore[arg-type]
            text = resp.choices[0].message.content or ""
            good.append((shapes.parse_answer(text, len(items)) == items, time.monotonic() - t0))

    async def main() -> None:
        stop = asyncio.Event()
        loop_task = asyncio.create_task(good_loop(stop))
        try:
            await storm()
        finally:
            stop.set()
        await loop_task

    t0 = time.monotonic()
    asyncio.run(main())
    elapsed = time.monotonic() - t0
    time.sleep(2)  # workers hand freed heap back to the OS shortly after large requests (runtime/memtrim.py)
    rss_after = _rss(cluster)
    grown = {k: (rss_after[k] - rss_before[k]) / 2**20 for k in rss_before}
    metrics_after = _router_metrics(cluster)
    print(f"{N_BAD} bad requests in {elapsed:.1f} s at concurrency {CONCURRENCY}: statuses {bad_statuses}; "
          f"{len(good)} good requests interleaved, {sum(ok for ok, _ in good)} answered correctly, "
          f"latency max {max(t for _, t in good):.2f} s")
    print("RSS before (MiB):", {k: round(v / 2**20) for k, v in rss_before.items()})
    print("RSS growth (MiB):", {k: round(v, 1) for k, v in grown.items()})
    assert sum(bad_statuses.values()) == N_BAD
    assert all(400 <= s < 500 for s in bad_statuses), (bad_statuses, not_4xx)
    assert len(good) >= 5  # every good request got a 200 (an error would have raised)
    assert all(v >= 0 for v in rss_after.values()), rss_after  # no worker died
    assert all(g < RSS_BOUND_MIB for g in grown.values()), grown
    # smg: no retries and no breaker trips caused by the bad requests
    retries = _metric_sum(metrics_after, "smg_worker_retries_total") - _metric_sum(metrics_before,
                                                                                  "smg_worker_retries_total")
    assert retries == 0, retries
    for line in metrics_after.splitlines():
        if line.startswith("smg_worker_cb_state"):
            assert line.rsplit(" ", 1)[1] in ("0", "0.0"), line  # 0 = closed
    doc = cluster.status()
    assert all(w["alive"] and w["healthy"] for w in doc["workers"]), doc
    prefill = next(p for p in cluster.state()["processes"] if p["role"] == "prefill")
    listing = json.loads(_http("GET", prefill["url"] + "/list_encoder_urls")[1])
    assert len(listing["encoder_urls"]) == 2 and all(e["failures"] == 0 for e in listing["encoders"]), listing
