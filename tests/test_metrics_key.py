"""The control plane reads a keyed cluster's /metrics with the key (epdctl/http/metrics.py): every
reader passes the variable that holds it, every fetch sends ``Bearer`` read from it at call
time, and no process-wide key exists (loading a keyed state changes no other read); the
Prometheus SD file never holds the key, and writing it tells how to scrape with one."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from epdctl.orchestrate import prometheus_sd
from epdctl.http import metrics
from epdctl.state.store import ClusterDir, ClusterState, ProcessRecord

KEY = "k-metrics-123"


@pytest.fixture
def server() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_GET(self) -> None:
            auth = self.headers.get("Authorization", "")
            seen.append(auth)
            ok = auth == f"Bearer {KEY}"
            body = b"# TYPE epd_x_total counter\nepd_x_total 3\n" if ok else b"unauthorized"
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    srv.shutdown()


def test_every_metrics_read_carries_the_key_it_is_given_and_only_that(
        server: tuple[str, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url, seen = server
    monkeypatch.setenv("EPD_METRICS_TEST_KEY", KEY)
    assert metrics.worker(url, api_key_env=None) == {} and seen[-1] == ""   # no key named: 401
    assert metrics.worker(url, api_key_env="EPD_METRICS_TEST_KEY") == {"epd_x_total": 3.0}
    assert seen[-1] == f"Bearer {KEY}"
    assert metrics.page(url + "/metrics", api_key_env="EPD_METRICS_TEST_KEY") == {"epd_x_total": 3.0}
    eps = [metrics.Endpoint("w", "decode", url + "/metrics")]
    assert list(metrics.scrape(eps, api_key_env="EPD_METRICS_TEST_KEY")) == ["w"]
    assert metrics.scrape(eps, api_key_env=None) == {}
    # the variable is read at call time: a key rotated in the environment is used at once
    monkeypatch.setenv("EPD_METRICS_TEST_KEY", "rotated")
    assert metrics.fetch(url, api_key_env="EPD_METRICS_TEST_KEY").status == 401
    assert seen[-1] == "Bearer rotated"
    # an unset variable sends no header at all (not "Bearer None")
    monkeypatch.delenv("EPD_METRICS_TEST_KEY")
    assert metrics.fetch(url, api_key_env="EPD_METRICS_TEST_KEY").status == 401 and seen[-1] == ""


def test_loading_or_saving_a_keyed_state_leaves_other_reads_alone(
        server: tuple[str, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two clusters in one process (a test, `bench URL` beside a recorded cluster): the keyed
    one's state must not make reads of the open one send its key."""
    url, seen = server
    monkeypatch.setenv("EPD_METRICS_TEST_KEY", KEY)
    cdir = ClusterDir("keyed", tmp_path)
    state = ClusterState(name="keyed", topology="t.yaml", launcher="local", engine="embedded",
                         api_key_env="EPD_METRICS_TEST_KEY")
    cdir.save(state)
    loaded = cdir.load()
    assert loaded is not None and loaded.api_key_env == "EPD_METRICS_TEST_KEY"
    assert metrics.worker(url, api_key_env=None) == {} and seen[-1] == ""
    assert not hasattr(metrics, "use_cluster_key")
    assert metrics.worker(url, api_key_env=loaded.api_key_env) == {"epd_x_total": 3.0}


def test_the_sd_file_holds_no_key_and_the_hint_names_credentials_file(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPD_METRICS_TEST_KEY", KEY)
    state = ClusterState(name="keyed", topology="t.yaml", launcher="local", engine="embedded",
                         api_key_env="EPD_METRICS_TEST_KEY",
                         processes=[ProcessRecord(name="decode-0", role="decode", node="local", host="127.0.0.1",
                                                  port=31003, url="http://127.0.0.1:31003")])
    sd = tmp_path / "targets.json"
    assert prometheus_sd.write(sd, state) == 1
    assert KEY not in sd.read_text()
    hint = prometheus_sd.key_hint(state)
    assert hint and "credentials_file" in hint and "$EPD_METRICS_TEST_KEY" in hint and KEY not in hint
    assert prometheus_sd.key_hint(ClusterState(name="open", topology="t", launcher="local", engine="e")) is None
