"""The per-process supervisor (epdctl/node/supervise.py) on real processes: a real HTTP
server as the worker, real signals, the pid file it keeps."""

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
from typing import Any

import psutil
import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Sup:
    def __init__(self, tmp: Path, argv: list[str], policy: dict[str, Any], health: str | None):
        self.pid_file = tmp / "w.pid.json"
        self.log = tmp / "w.log"
        env = {**os.environ, "EPDCTL_RESTART": json.dumps(policy), "EPDCTL_PID_FILE": str(self.pid_file),
               "EPDCTL_CLUSTER": "c@test", "EPDCTL_WORKER": "w", "EPDCTL_TOKEN": "tok"}
        if health:
            env["EPDCTL_HEALTH_URL"] = health
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "epdctl.node.supervise", "--", *argv],
                                         stdout=out, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)

    def doc(self) -> dict[str, Any]:
        try:
            return json.loads(self.pid_file.read_text())
        except (OSError, ValueError):
            return {}

    def until(self, pred: Any, timeout: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            d = self.doc()
            if pred(d):
                return d
            time.sleep(0.05)
        raise AssertionError(f"timed out; pid file: {self.doc()}; log: {self.log.read_text()}")

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def server(tmp_path: Path) -> Any:
    made: list[Sup] = []

    def make(policy: dict[str, Any], argv: list[str] | None = None, health: bool = True,
             port: int | None = None) -> tuple[Sup, str]:
        port = port or _free_port()
        url = f"http://127.0.0.1:{port}/"
        argv = argv or [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
        sup = Sup(tmp_path, argv, policy, url if health else None)
        made.append(sup)
        return sup, url
    yield make
    for s in made:
        s.close()


def _get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=2) as r:
        return int(r.status)


def test_a_worker_killed_after_it_was_healthy_is_restarted_and_serves_again(server: Any) -> None:
    sup, url = server({"policy": "on-failure", "limit": 3, "backoff": 0.2})
    first = sup.until(lambda d: d.get("state") == "running")
    assert first["pid"] == sup.proc.pid and first["token"] == "tok" and first["restarts"] == 0
    child = psutil.Process(first["child_pid"])
    assert child.environ()["EPDCTL_TOKEN"] == "tok"       # the marker is on the worker too
    assert os.getpgid(child.pid) == sup.proc.pid           # one group: a stop takes both
    child.kill()
    again = sup.until(lambda d: d.get("restarts") == 1 and d.get("state") == "running")
    assert again["child_pid"] != first["child_pid"]
    assert again["last_exit"] == "killed by signal 9 (SIGKILL)"
    assert _get(url) == 200
    assert "killed by signal 9 (SIGKILL); restart 1/3 in 0.2s" in sup.log.read_text()


def test_the_limit_ends_supervision_with_the_workers_status(server: Any) -> None:
    sup, _url = server({"policy": "on-failure", "limit": 2, "backoff": 0.1})
    for n in range(3):
        d = sup.until(lambda d, n=n: d.get("restarts") == n and d.get("state") == "running")
        psutil.Process(d["child_pid"]).kill()
    assert sup.proc.wait(20) == 128 + 9
    assert sup.doc()["state"] == "exited" and sup.doc()["restarts"] == 2
    assert "limit of 2 restarts reached" in sup.log.read_text()


def test_a_worker_that_never_became_healthy_is_not_restarted(server: Any) -> None:
    sup, _url = server({"policy": "always", "limit": 5, "backoff": 0.1},
                       argv=[sys.executable, "-c", "import sys, time; time.sleep(0.5); sys.exit(3)"])
    assert sup.proc.wait(20) == 3      # `up` sees the worker's own exit status
    assert sup.doc()["restarts"] == 0 and sup.doc()["last_exit"] == "exited with status 3"


@pytest.mark.parametrize("policy", ["never", "on-failure"])
def test_sigterm_to_the_group_stops_without_restart(server: Any, policy: str) -> None:
    sup, _url = server({"policy": policy, "limit": 5, "backoff": 0.1})
    sup.until(lambda d: d.get("state") == "running")
    os.killpg(sup.proc.pid, signal.SIGTERM)
    sup.proc.wait(20)
    assert sup.doc()["state"] == "stopped" and sup.doc()["restarts"] == 0


def test_the_worker_dies_with_its_supervisor(server: Any) -> None:
    sup, _url = server({"policy": "on-failure"})
    d = sup.until(lambda d: d.get("state") == "running")
    os.kill(sup.proc.pid, signal.SIGKILL)
    sup.proc.wait(10)
    deadline = time.monotonic() + 10
    while psutil.pid_exists(d["child_pid"]) and time.monotonic() < deadline:
        try:
            if psutil.Process(d["child_pid"]).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    alive = psutil.pid_exists(d["child_pid"]) and psutil.Process(d["child_pid"]).status() != psutil.STATUS_ZOMBIE
    assert not alive


# A worker that tells its supervisor it is ready (the embedded runtime's start_runners does,
# listen.py) and dies at once on its first run: no health probe can have seen it, so only the
# ready byte can arm the restart. Deterministic: the first run never serves at all.
READY_THEN_DIE = """
import os, signal, sys
from pathlib import Path
marker = Path(sys.argv[1])
if not marker.exists():
    marker.write_text("first run")
    os.write(int(os.environ["EPDCTL_READY_FD"]), b"R")
    os.kill(os.getpid(), signal.SIGKILL)
os.execv(sys.executable, [sys.executable, "-m", "http.server", sys.argv[2], "--bind", "127.0.0.1"])
"""


def test_a_worker_that_said_ready_is_restarted_even_if_it_dies_before_any_probe(server: Any,
                                                                                 tmp_path: Path) -> None:
    port = _free_port()
    sup, url = server({"policy": "on-failure", "limit": 3, "backoff": 0.1},
                      argv=[sys.executable, "-c", READY_THEN_DIE, str(tmp_path / "marker"), str(port)],
                      port=port)
    d = sup.until(lambda d: d.get("restarts") == 1 and d.get("state") == "running")
    assert d["last_exit"] == "killed by signal 9 (SIGKILL)"
    assert "restart 1/3" in sup.log.read_text()
    assert _get(url) == 200  # the second run serves (armed by its first good probe)


def test_a_worker_that_never_wrote_the_byte_and_died_before_healthy_is_not_restarted(server: Any) -> None:
    sup, _url = server({"policy": "on-failure", "limit": 3, "backoff": 0.1},
                       argv=[sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert sup.proc.wait(20) == 128 + 9
    assert sup.doc()["restarts"] == 0 and sup.doc()["state"] == "exited"
