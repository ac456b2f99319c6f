"""The smg admin client against a real smg (started with no workers) and a dummy worker."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from epdctl.errors import ProbeError
from epdctl.http.probes import get_loads, parse_loads, probe_health, server_info
from epdctl.http.routerctl import RouterClient, with_local_health_flags

DUMMY = str(Path(__file__).parent / "e2e" / "dummy_worker.py")
SMG = str(Path(sys.executable).parent / "smg")
ROUTER, PROM, DEC = 34600, 34690, 34601
KEY_ENV = "EPDCTL_TEST_RC_KEY"


def _wait(cond, what: str, limit: float = 60.0) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > limit:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def router() -> Iterator[RouterClient]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KEY_ENV, "rc-s3cret")
        yield from _router()


def _router() -> Iterator[RouterClient]:
    procs = [
        subprocess.Popen([sys.executable, DUMMY, str(DEC), "decode"], stdout=subprocess.DEVNULL),
        subprocess.Popen([SMG, "launch", "--pd-disaggregation", "--host", "127.0.0.1", "--port",
                          str(ROUTER), "--prometheus-host", "127.0.0.1", "--prometheus-port",
                          str(PROM), "--api-key", "rc-s3cret",
                          *with_local_health_flags([])],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    ]
    client = RouterClient(f"http://127.0.0.1:{ROUTER}", KEY_ENV)
    try:
        _wait(client.alive, "smg to answer /health")
        _wait(lambda: probe_health(f"http://127.0.0.1:{DEC}").ok, "the dummy worker")
        yield client
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


def test_empty_router_is_not_ready(router: RouterClient) -> None:
    ready, doc = router.readiness()
    assert ready is False and "insufficient" in doc.get("reason", "")
    assert router.workers() == []


def test_add_find_and_remove_a_worker(router: RouterClient) -> None:
    url = f"http://127.0.0.1:{DEC}"
    wid = router.add_worker(url, "decode", model="dummy")
    _wait(lambda: (w := router.find(url)) is not None and w.healthy, "the worker to be healthy")
    w = router.find(url)
    assert w is not None and w.id == wid and w.worker_type == "decode" and w.status == "ready"
    router.remove_worker(wid)
    _wait(lambda: router.find(url) is None, "the worker to be removed")


def test_wrong_key_is_reported_without_the_key(monkeypatch: pytest.MonkeyPatch,
                                               router: RouterClient) -> None:
    monkeypatch.setenv("EPDCTL_TEST_WRONG", "not-the-key")
    bad = RouterClient(router.url, "EPDCTL_TEST_WRONG")
    with pytest.raises(ProbeError) as e:
        bad.workers()
    msg = str(e.value)
    assert "HTTP 401" in msg and "$EPDCTL_TEST_WRONG" in msg
    assert "not-the-key" not in msg and "rc-s3cret" not in msg
    nokey = RouterClient(router.url)
    with pytest.raises(ProbeError, match="wants an API key"):
        nokey.workers()


def test_unreachable_router() -> None:
    c = RouterClient("http://127.0.0.1:34699")
    assert c.alive() is False
    ready, doc = c.readiness()
    assert ready is False and doc["status"] == "unreachable"
    with pytest.raises(ProbeError, match="unreachable.*epdctl status"):
        c.workers()


def test_worker_probes(router: RouterClient) -> None:
    url = f"http://127.0.0.1:{DEC}"
    load = get_loads(url)
    assert load is not None and (load.running, load.waiting, load.token_usage) == (1, 2, 0.25)
    info = server_info(url)
    assert info is not None and info["disaggregation_mode"] == "decode"
    dead = probe_health("http://127.0.0.1:34698")
    assert not dead.ok and dead.detail


@pytest.mark.parametrize("doc, want", [
    ({"loads": [{"num_running_reqs": 3, "num_waiting_reqs": 1, "token_usage": 0.5},
                {"num_running_reqs": 2, "num_waiting_reqs": 0, "token_usage": 0.7}]}, (5, 1, 0.7)),
    ({"loads": [{"num_running_reqs": None}]}, (0, 0, None)),
    ({"loads": "x"}, None),
    ([], None),
    (None, None),
])
def test_parse_loads(doc: object, want: tuple | None) -> None:
    got = parse_loads(doc)
    assert (None if got is None else (got.running, got.waiting, got.token_usage)) == want


def test_local_health_flags_keep_plan_values() -> None:
    argv = with_local_health_flags(["--health-check-interval-secs", "5"])
    assert argv[:2] == ["--health-check-interval-secs", "5"]
    assert argv.count("--health-check-interval-secs") == 1
    assert "--health-failure-threshold" in argv
