"""A router restarted by its supervisor comes back with every worker it had (supervise.py):
the real smg router, real HTTP workers (tests/e2e/dummy_worker.py), one worker added at run time
through ``POST /workers`` the way `rebalance` adds one, then ``kill -9`` of smg itself."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from epdctl.node.supervise import argv_urls, with_workers
from epdctl.http.routerctl import RouterClient

ROOT = Path(__file__).resolve().parents[1]
DUMMY = ROOT / "tests" / "e2e" / "dummy_worker.py"


def test_with_workers_replaces_every_worker_flag_in_place() -> None:
    argv = ["py", "-m", "smg.launch_router", "--pd-disaggregation", "--prefill", "http://p:1", "9",
            "--prefill", "http://p:2", "none", "--decode", "http://d:1", "--host", "127.0.0.1"]
    workers = [{"url": "http://p:1", "worker_type": "prefill", "bootstrap_port": 9},
               {"url": "http://d:1", "worker_type": "decode", "bootstrap_port": None},
               {"url": "http://d:2", "worker_type": "decode", "bootstrap_port": None}]
    assert with_workers(argv, workers) == [
        "py", "-m", "smg.launch_router", "--pd-disaggregation", "--prefill", "http://p:1", "9",
        "--decode", "http://d:1", "--decode", "http://d:2", "--host", "127.0.0.1"]
    plain = ["py", "-m", "smg.launch_router", "--worker-urls", "http://a:1", "http://a:2", "--port", "5"]
    assert with_workers(plain, [{"url": "http://a:3", "worker_type": "regular"}]) == [
        "py", "-m", "smg.launch_router", "--worker-urls", "http://a:3", "--port", "5"]


def test_argv_urls_names_the_workers_a_router_was_started_with() -> None:
    """Until all of them are on the router's list, the supervisor keeps its last list."""
    argv = ["py", "-m", "smg.launch_router", "--prefill", "http://p:1", "9", "--decode", "http://d:1/",
            "--worker-urls", "http://a:1", "http://a:2", "--host", "127.0.0.1", "--port", "5"]
    assert argv_urls(argv) == {"http://p:1", "http://d:1", "http://a:1", "http://a:2"}


def _ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [int(s.getsockname()[1]) for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def _routed(url: str, n: int) -> set[str]:
    seen = set()
    for _ in range(n):
        req = urllib.request.Request(url + "/v1/chat/completions", method="POST", data=json.dumps(
            {"model": "dummy", "messages": [{"role": "user", "content": "hi"}]}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            seen.add(r.headers["x-smg-routed-worker-id"])
    return seen


def test_a_router_killed_after_a_runtime_registration_comes_back_with_that_worker(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    p, boot, d1, d2, r, m = _ports(6)
    with open(tmp_path / "workers.log", "ab") as log:
        for port, extra in ((p, ["prefill", "--bootstrap-port", str(boot)]), (d1, ["decode"]), (d2, ["decode"])):
            procs.append(subprocess.Popen([sys.executable, str(DUMMY), str(port), *extra], stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))
    url = f"http://127.0.0.1:{r}"
    env = {**os.environ, "EPDCTL_RESTART": json.dumps({"policy": "on-failure", "limit": 3, "backoff": 0.5}),
           "EPDCTL_PID_FILE": str(tmp_path / "router.pid.json"), "EPDCTL_HEALTH_URL": url + "/health",
           "EPDCTL_ROUTER": "1", "EPDCTL_WORKER": "router"}
    smg = [sys.executable, "-m", "smg.launch_router", "--pd-disaggregation", "--enable-igw",
           "--prefill", f"http://127.0.0.1:{p}", str(boot), "--decode", f"http://127.0.0.1:{d1}",
           "--host", "127.0.0.1", "--port", str(r), "--prometheus-host", "127.0.0.1", "--prometheus-port", str(m),
           "--health-check-interval-secs", "1", "--worker-startup-check-interval", "1",
           "--cb-timeout-duration-secs", "2", "--policy", "round_robin"]
    with open(tmp_path / "router.log", "ab") as log:
        procs.append(subprocess.Popen([sys.executable, "-m", "epdctl.node.supervise", "--", *smg], env=env,
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    client = RouterClient(url)
    pid_file = tmp_path / "router.pid.json"

    def until(pred: Any, timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                got = pred()
                if got:
                    return got
            except Exception:  # noqa: not yet
                pass
            time.sleep(0.2)
        raise AssertionError(f"timed out; router log:\n{(tmp_path / 'router.log').read_text()[-3000:]}")

    until(lambda: len([w for w in client.workers() if w.healthy]) == 2)
    client.add_worker(f"http://127.0.0.1:{d2}", "decode", model="dummy")  # as rebalance does
    until(lambda: len([w for w in client.workers() if w.healthy]) == 3)
    assert _routed(url, 12) == {f"http://127.0.0.1:{d1}", f"http://127.0.0.1:{d2}"}
    time.sleep(2.5)  # the supervisor copies the router's worker list every 2 s
    first = until(lambda: json.loads(pid_file.read_text()) if "child_pid" in pid_file.read_text() else None)
    os.kill(first["child_pid"], signal.SIGKILL)
    until(lambda: json.loads(pid_file.read_text())["restarts"] == 1
          and json.loads(pid_file.read_text())["state"] == "running")
    until(lambda: len([w for w in client.workers() if w.healthy]) == 3, timeout=30)
    assert {w.url for w in client.workers()} == {f"http://127.0.0.1:{x}" for x in (p, d1, d2)}
    assert until(lambda: _routed(url, 12) == {f"http://127.0.0.1:{d1}", f"http://127.0.0.1:{d2}"})
    assert "router restarts with the 3 worker(s) it had" in (tmp_path / "router.log").read_text()
