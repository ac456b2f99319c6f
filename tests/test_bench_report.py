"""Bench pieces without a cluster: workloads, percentiles, the report, metric deltas, the
streaming client's error handling and the PNG. The HTTP servers here are real (aiohttp on
loopback); the e2e test runs the same code against a real cluster."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Iterator

import pytest
from aiohttp import web

from epdctl.http import metrics as scrape
from epdctl.bench import client, report
from epdctl.bench.client import Sample, Target
from epdctl.bench.workload import (RequestSource, Workload, WorkloadError, from_dict,
                                   load_workload, parse_images)
from epdctl.runtime.metrics import Registry

ROOT = Path(__file__).resolve().parents[1]


# ---- workloads -------------------------------------------------------------------------------

def test_parse_images_forms() -> None:
    assert parse_images(4) == {4: 1.0}
    assert parse_images("2-4") == {2: 1 / 3, 3: 1 / 3, 4: 1 / 3}
    assert parse_images({1: 3, 8: 1}) == {1: 0.75, 8: 0.25}
    for bad in ("8-4", "x", 0, {}, True, {2: -1}):
        with pytest.raises(WorkloadError, match="images"):
            parse_images(bad)


def test_same_seed_same_bytes_and_repeats_reuse_images() -> None:
    w = Workload(images={3: 1.0}, repeat=0.5, seed=7, rate=1.0)
    a, b = RequestSource(w), RequestSource(w)
    ra = [a.next() for _ in range(20)]
    rb = [b.next() for _ in range(20)]
    assert [r.pngs for r in ra] == [r.pngs for r in rb]
    pngs = [p for r in ra for p in r.pngs]
    assert len(set(pngs)) < len(pngs)  # repeats are the same bytes (an embedding-cache hit)
    rep = sum(r.repeated for r in ra) / len(pngs)
    assert 0.3 < rep < 0.7
    assert all(r.expected.startswith("Picture 1: ") for r in ra)
    # arrivals come from their own generator: the requests do not depend on the rate
    c = RequestSource(Workload(images={3: 1.0}, repeat=0.5, seed=7, rate=9.0))
    c.interarrival()
    assert c.next().pngs == ra[0].pngs


def test_every_shipped_workload_loads() -> None:
    files = sorted((ROOT / "benchmarks" / "workloads").glob("*.yaml"))
    assert files
    for f in files:
        w = load_workload(f)
        assert w.rate is not None or w.concurrency is not None or w.hours, f


def test_workload_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="unknown key"):
        from_dict({"images": 2, "rat": 1})
    with pytest.raises(WorkloadError, match="repeat"):
        from_dict({"repeat": 1.5})
    with pytest.raises(WorkloadError, match="hours"):
        from_dict({"hours": {25: 1.0}})
    p = tmp_path / "w.yaml"
    p.write_text("images: [\n")
    with pytest.raises(WorkloadError, match="not valid YAML"):
        load_workload(p)
    with pytest.raises(WorkloadError, match="cannot read"):
        load_workload(tmp_path / "missing.yaml")


# ---- report ----------------------------------------------------------------------------------

def _sample(i: int, ok: bool = True, ttft: float = 0.1, tpot: float = 0.02) -> Sample:
    return Sample(index=i, start=i * 0.5, n_images=4, repeated=1, ok=ok, status=200 if ok else 500,
                  ttft=ttft if ok else None, tpot=tpot if ok else None,
                  latency=ttft + 10 * tpot, prompt_tokens=50, completion_tokens=11 if ok else 0,
                  correct=ok, error="" if ok else "HTTP 500: boom",
                  timings={"encode_ms": 30.0, "prefill_ms": 20.0} if ok else {})


def test_percentiles_are_nearest_rank() -> None:
    xs = [float(i) for i in range(1, 101)]
    assert report.percentile(xs, 50) == 50.0
    assert report.percentile(xs, 99) == 99.0
    assert report.percentile([3.0], 90) == 3.0
    assert report.percentile([], 50) is None


def test_summarize_counts_throughput_and_errors() -> None:
    samples = [_sample(i, ttft=0.1 * (i + 1)) for i in range(10)] + [_sample(10, ok=False)]
    r = report.summarize(samples, 5.0, workload="w", target="http://x", offered_rate=2.0)
    assert (r["requests"], r["ok"], r["errors"]) == (11, 10, 1)
    assert r["error_kinds"] == {"HTTP 500": 1}
    assert r["throughput"]["requests_per_s"] == 2.0
    assert r["throughput"]["output_tokens_per_s"] == 22.0
    assert r["throughput"]["images_per_s"] == 8.0
    assert r["ttft_ms"]["p50"] == 500.0 and r["ttft_ms"]["p99"] == 1000.0
    assert r["tpot_ms"]["p90"] == 20.0
    assert r["stages_ms"]["encode_ms"]["p50"] == 30.0
    assert r["correct"] == {"judged": 10, "correct": 10, "cut_off": 0}
    text = "\n".join(report.format_report(r))
    assert "TTFT ms  p50 500.0" in text and "error: HTTP 500: boom" in text
    json.dumps(r)  # the --json document must serialise
    # answers cut off by max_tokens (correct=None) are counted apart, not judged wrong
    cut = [_sample(i) for i in range(3)]
    cut[0].correct = None
    c = report.summarize(cut, 1.0, workload="w", target="http://x", offered_rate=1.0)["correct"]
    assert c == {"judged": 2, "correct": 2, "cut_off": 1}


# ---- metrics scrape --------------------------------------------------------------------------

def _serve(app: web.Application) -> Iterator[str]:
    """Run ``app`` on a free loopback port in a thread; yields its base URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        t.join(5)
        loop.run_until_complete(runner.cleanup())
        loop.close()


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, Registry]]:
    reg = Registry("epd_encoder")
    reg.counter("cache_misses_total", "misses")
    reg.histogram("encode_seconds", "latency")

    async def h(_: web.Request) -> web.Response:
        return web.Response(text=reg.render(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", h)
    for url in _serve(app):
        yield url, reg


def test_scrape_delta_keeps_only_what_changed(metrics_server: tuple[str, Registry]) -> None:
    url, reg = metrics_server
    hist = reg.histogram("encode_seconds", "latency")
    ctr = reg.counter("cache_misses_total", "misses")
    ctr.inc(5)
    hist.observe(1.0)
    eps = [scrape.Endpoint("encoder-0", "encoder", url + "/metrics"),
           scrape.Endpoint("gone", "encoder", "http://127.0.0.1:9/metrics")]
    before = scrape.scrape(eps, api_key_env=None)
    assert set(before) == {"encoder-0"}  # the dead endpoint is skipped, not fatal
    ctr.inc(3)
    hist.observe(0.2)
    hist.observe(0.4)
    d = scrape.delta(before, scrape.scrape(eps, api_key_env=None))
    got = d["encoder-0"]
    assert got["epd_encoder_cache_misses_total"] == 3
    assert got["epd_encoder_encode_seconds_count"] == 2
    assert not any("_bucket" in k for k in got)
    assert scrape.stage_means(d)["encoder-0"]["epd_encoder_encode_seconds"] == pytest.approx(0.3)


def test_parse_prometheus_labels_and_comments() -> None:
    text = ('# HELP x y\n# TYPE x counter\nx_total{a="1",b="2"} 3\nbad line\n'
            'smg_pd_ttft_seconds_sum{model="m"} 1.5e-1\n')
    assert scrape.parse(text) == {'x_total{a="1",b="2"}': 3.0,
                                             'smg_pd_ttft_seconds_sum{model="m"}': 0.15}


# ---- client against a real SSE server -------------------------------------------------------

@pytest.fixture
def sse_server() -> Iterator[str]:
    calls = {"n": 0}

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        assert body["stream"] and body["stream_options"]["include_usage"]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for piece in ("Picture 1: ", "red ", "circle"):
            chunk = {"choices": [{"index": 0, "delta": {"content": piece}}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await asyncio.sleep(0.01)
        tail = {"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 3},
                "timings": {"encode_ms": 5.0, "prefill_ms": 4.0}}
        await resp.write(b"data: " + json.dumps(tail).encode() + b"\n\ndata: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    yield from _serve(app)


def test_client_measures_streams_and_counts_errors(sse_server: str) -> None:
    w = Workload(images={1: 1.0}, concurrency=2, requests=6, max_tokens=8)
    seen: list[tuple[int, int]] = []
    samples, wall = client.run(Target(sse_server, "m"), w,
                               lambda done, sent, err, el: seen.append((done, err)))
    assert len(samples) == 6 and [s.index for s in samples] == list(range(6))
    bad = [s for s in samples if not s.ok]
    assert len(bad) == 2 and all(s.status == 503 and "overloaded" in s.error for s in bad)
    good = [s for s in samples if s.ok]
    assert all(s.ttft is not None and s.tpot is not None and s.completion_tokens == 3
               for s in good)
    assert all(s.timings == {"encode_ms": 5.0, "prefill_ms": 4.0} for s in good)
    assert seen[-1] == (6, 2)
    r = report.summarize(samples, wall)
    assert r["ok"] == 4 and r["error_kinds"] == {"HTTP 503": 2}


def test_client_reports_unreachable_server() -> None:
    w = Workload(images={1: 1.0}, rate=50.0, requests=2, timeout=5)
    samples, _ = client.run(Target("http://127.0.0.1:9", "m"), w)
    assert len(samples) == 2 and not any(s.ok for s in samples)
    assert all("ClientConnectorError" in s.error for s in samples)


def test_plot_writes_a_png(tmp_path: Path) -> None:
    runs = []
    for rate in (0.5, 1.0):
        samples = [_sample(i, ttft=0.05 * (i + 1) * rate) for i in range(8)]
        runs.append((f"rate {rate}", samples, report.summarize(samples, 4.0, offered_rate=rate)))
    from epdctl.bench.plot import plot_runs

    out = plot_runs(runs, tmp_path / "p.png", title="t")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_grafana_dashboard_uses_series_the_workers_export() -> None:
    """Every epd_* series the dashboard queries is registered by a runtime server."""
    import re

    dash = json.loads((ROOT / "monitoring" / "grafana-epdctl.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert exprs and dash["uid"] == "epdctl-epd"
    source = "".join(p.read_text() for p in (ROOT / "epdctl" / "runtime" / "servers").glob("*.py"))
    source += (ROOT / "epdctl" / "runtime" / "servers" / "info.py").read_text()
    names = {n for e in exprs for n in re.findall(r"\b(epd_[a-z_]+)", e)}
    assert names
    for full in sorted(names):
        role, _, rest = full[len("epd_"):].partition("_")
        base = re.sub(r"_(bucket|sum|count)$", "", rest)
        prefixes = {"transport_" + base.removeprefix("transport_"), base}
        assert f'Registry("epd_{role}")' in source, full
        assert any(f'"{b}"' in source for b in prefixes), f"{full} is not exported by any worker"
