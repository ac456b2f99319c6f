"""Drain/register control points against recorded SGLang responses and a real smg router.

The SGLang side is a small HTTP server replaying ``tests/fixtures/sglang/*.json`` (written from
the measured reference docs, see each file's ``_source``; SGLang needs a GPU and cannot run
here). The router is the real smg 1.13.0 (``python -m smg.launch_router``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from epdctl.engines import engine_for
from epdctl.rebalance import drain as dr
from epdctl.http import metrics
from epdctl.http.routerctl import RouterClient, with_local_health_flags

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "sglang"


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


class FakeSglang(ThreadingHTTPServer):
    """Replays recorded SGLang answers; loads/metrics go idle after ``busy_polls`` reads."""

    daemon_threads = True

    def __init__(self, busy_polls: int = 2):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.busy_polls = busy_polls
        self.polls = {"loads": 0, "metrics": 0}
        self.calls: list[tuple[str, str, Any]] = []
        self.encoders = list(fixture("list_encoder_urls")["body"]["encoder_urls"])
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeSglang

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, fx: dict[str, Any]) -> None:
        if "text" in fx:
            data, ctype = fx["text"].encode(), "text/plain"
        else:
            data, ctype = json.dumps(fx["body"]).encode(), "application/json"
        self.send_response(fx["status"])
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n)) if n else None

    def _busy(self, what: str) -> bool:
        self.server.polls[what] += 1
        return self.server.polls[what] <= self.server.busy_polls

    def do_GET(self) -> None:
        s = self.server
        s.calls.append(("GET", self.path, None))
        if self.path == "/health":
            self._send({"status": 200, "text": "OK"})
        elif self.path == "/server_info":
            self._send(fixture("server_info"))
        elif self.path.startswith("/v1/loads"):
            self._send(fixture("v1_loads_busy" if self._busy("loads") else "v1_loads_idle"))
        elif self.path == "/metrics":
            self._send(fixture("encoder_metrics_busy" if self._busy("metrics")
                               else "encoder_metrics_idle"))
        elif self.path == "/list_encoder_urls":
            self._send({"status": 200, "body": {"encoder_urls": s.encoders}})
        else:
            self._send({"status": 404, "body": {"error": "not found"}})

    def do_POST(self) -> None:
        body = self._body()
        self.server.calls.append(("POST", self.path, body))
        if self.path == "/pause_generation":
            self._send(fixture("pause_generation"))
        elif self.path == "/continue_generation":
            self._send(fixture("continue_generation"))
        elif self.path == "/register_encoder_url":
            if body["url"] not in self.server.encoders:
                self.server.encoders.append(body["url"])
            self._send({"status": 200, "body": {"status": "ok"}})
        else:
            self._send({"status": 404, "body": {"error": "not found"}})

    def do_DELETE(self) -> None:
        body = self._body()
        self.server.calls.append(("DELETE", self.path, body))
        if self.path == "/unregister_encoder_url" and body["url"] in self.server.encoders:
            self.server.encoders.remove(body["url"])
            self._send({"status": 200, "body": {"status": "ok"}})
        else:
            self._send({"status": 404, "body": {"error": f"{body} is not registered"}})


@pytest.fixture
def fake() -> Iterator[FakeSglang]:
    srv = FakeSglang()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_loads_are_summed_over_dp_ranks_until_idle(fake: FakeSglang) -> None:
    assert not dr.loads_idle(fake.url)        # busy fixture: 5 running + 1 waiting
    dr.wait_loads_idle(fake.url, timeout=30)  # idle after the recorded busy polls
    assert fake.polls["loads"] >= 3


def test_wait_loads_idle_times_out_with_a_clear_error(fake: FakeSglang) -> None:
    fake.busy_polls = 10**9
    with pytest.raises(dr.DrainError, match="still has requests in flight"):
        dr.wait_loads_idle(fake.url, timeout=0.5)


def test_sglang_drain_pauses_after_the_loads_reach_zero(fake: FakeSglang) -> None:
    done = dr.drain("decode", fake.url, engine=engine_for("sglang"), client=None, registries=[], timeout=30)
    assert done["paused"] == {"status": "ok"}  # plain-text reply treated as opaque success
    posts = [(p, b) for m, p, b in fake.calls if m == "POST"]
    assert posts == [("/pause_generation", {"mode": "abort"})]
    loads_before_pause = [i for i, c in enumerate(fake.calls) if c[1].startswith("/v1/loads")]
    pause_at = next(i for i, c in enumerate(fake.calls) if c[1] == "/pause_generation")
    assert max(loads_before_pause) < pause_at
    dr.continue_generation(fake.url)
    assert fake.calls[-1][1] == "/continue_generation"


def test_embedded_drain_does_not_pause(fake: FakeSglang) -> None:
    dr.drain("prefill", fake.url, engine=engine_for("embedded"), client=None, registries=[], timeout=30)
    assert not any(c[1] == "/pause_generation" for c in fake.calls)


def test_encoder_drain_unregisters_from_every_registry_then_waits_quiet(fake: FakeSglang) -> None:
    """``fake`` is the encoder (its /metrics); two more fakes are prefills' registries."""
    regs = [FakeSglang(), FakeSglang()]
    try:
        for r in regs:
            r.encoders.append(fake.url)
        done = dr.drain("encoder", fake.url, engine=engine_for("sglang"), client=None,
                        registries=[r.url for r in regs], timeout=30)
        assert done["registries"] == [r.url for r in regs]
        assert fake.polls["metrics"] > fake.busy_polls  # waited through the busy samples
        for r in regs:
            assert fake.url not in dr.list_encoders(r.url)
            assert "http://10.0.0.1:30000" in dr.list_encoders(r.url)  # others untouched
        assert dr.unregister_encoder([regs[0].url], fake.url) == []  # 404: already gone
        dr.register_encoder([r.url for r in regs], fake.url, timeout=5)
        assert all(fake.url in dr.list_encoders(r.url) for r in regs)
    finally:
        for r in regs:
            r.shutdown()
            r.server_close()


def test_encoder_drain_times_out_while_the_queue_stays_busy(fake: FakeSglang) -> None:
    fake.busy_polls = 10**9
    with pytest.raises(dr.DrainError, match="still busy"):
        dr.wait_encoder_idle(fake.url, timeout=0.6, api_key_env=None)


def test_metric_parsing_sums_labels_and_reads_transfer_bytes(fake: FakeSglang) -> None:
    vals = metrics.summed(fixture("encoder_metrics_idle")["text"])
    assert vals["epd_encoder_requests_total"] == 44 and vals["epd_encoder_queue_depth"] == 0
    assert dr.transfer_bytes(fake.url, None) in (123456.0, 130000.0)


@pytest.fixture
def router() -> Iterator[RouterClient]:
    port, prom = 38711, 38712
    argv = [sys.executable, "-m", "smg.launch_router", "--pd-disaggregation", "--host",
            "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(prom)]
    proc = subprocess.Popen(with_local_health_flags(argv), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    client = RouterClient(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 60
        while not client.alive():
            assert proc.poll() is None, "smg exited during startup"
            assert time.monotonic() < deadline, "smg did not answer /health in 60 s"
            time.sleep(0.2)
        yield client
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_router_register_and_remove_a_recorded_sglang_decode(router: RouterClient,
                                                             fake: FakeSglang) -> None:
    wid = dr.router_add(router, fake.url, "decode", bootstrap_port=None, model="qwen2-vl-7b",
                        timeout=60)
    rec = router.find(fake.url)
    assert rec is not None and rec.id == wid and rec.worker_type == "decode" and rec.healthy
    assert dr.router_remove(router, fake.url, timeout=60) is True
    assert router.find(fake.url) is None
    assert dr.router_remove(router, fake.url) is False  # not registered: nothing to do
    done = dr.drain("decode", fake.url, engine=engine_for("sglang"), client=router, registries=[],
                    timeout=30)
    assert done["router"] is False and done["paused"]


def test_auto_collector_reads_queues_per_role_from_recorded_answers(fake: FakeSglang) -> None:
    from types import SimpleNamespace

    from epdctl.rebalance.signals import Collector

    fake.busy_polls = 10**9  # stay on the busy fixtures
    workers = [SimpleNamespace(role="encoder", url=fake.url, is_leader=True),
               SimpleNamespace(role="prefill", url=fake.url, is_leader=True),
               SimpleNamespace(role="decode", url=fake.url, is_leader=True),
               SimpleNamespace(role="decode", url=fake.url, is_leader=False)]  # rank 1: skipped
    s = Collector(prometheus_url=None, api_key_env=None).sample(1.0, workers)
    assert s.counts == {"encoder": 1, "prefill": 1, "decode": 1}
    # encoder: queue_depth 2; prefill/decode: 5 running + 1 waiting over two dp ranks
    assert s.queue == {"encoder": 2.0, "prefill": 6.0, "decode": 6.0} and s.ttft is None
