"""State you can lose: `down` stops exactly a cluster's processes whatever happened to
state.json, never a foreign process, and a killed `up` reads as failed.

Real processes (tests/e2e/dummy_worker.py HTTP workers under the real supervisor), the real CLI
(`down`, `status` through click), a real foreign process that forged records point at.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from epdctl.orchestrate.lifecycle import BringUp
from epdctl.launchers.local import LocalLauncher
from epdctl.state.store import ClusterDir, ClusterState

from test_lifecycle import Plan, _worker

BASE = 34800  # 34700-34799 is test_lifecycle.py's


def _up(name: str, base: int) -> tuple[ClusterDir, ClusterState, list[int]]:
    plan = Plan([_worker("encoder-0", "encoder", base + 1),
                 _worker("decode-0", "decode", base + 2)], None)
    cdir = ClusterDir(name)
    st = ClusterState(name=name, topology="t.yaml", launcher="local")
    with cdir.lock("up"):
        cdir.save(st)
        BringUp(LocalLauncher(cdir.root), cdir, st, timeout=60).run(plan)
    pids = [p.pid for rec in st.processes for p in _group(rec.handle.pgid)]  # type: ignore[union-attr]
    assert len(pids) == 4  # a supervisor and its worker per process
    return cdir, st, pids


def _group(pgid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Out:
    def __init__(self, proc: subprocess.CompletedProcess[str]):
        self.exit_code = proc.returncode
        self.output = proc.stdout + proc.stderr


def _epdctl(args: list[str]) -> Out:
    """The real CLI in a subprocess, as an operator runs it (tracebacks would show here)."""
    return Out(subprocess.run([sys.executable, "-m", "epdctl", *args], text=True,
                              capture_output=True, timeout=120, env=dict(os.environ)))


def _foreign() -> subprocess.Popen[bytes]:
    """A process that is not epdctl's: its own session, no marker."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                            start_new_session=True)


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _damage(kind: str, cdir: ClusterDir) -> None:
    text = cdir.state_file.read_text()
    doc = json.loads(text)
    if kind == "random bytes":
        cdir.state_file.write_bytes(os.urandom(512))
    elif kind == "truncated":
        cdir.state_file.write_text(text[: len(text) // 2])
    elif kind == "wrong-typed pids":
        for p in doc["processes"]:
            p["handle"]["pid"] = str(p["handle"]["pid"])
        cdir.state_file.write_text(json.dumps(doc))
    elif kind == "no processes":
        doc["processes"] = []
        cdir.state_file.write_text(json.dumps(doc))
    elif kind == "deleted":
        cdir.state_file.unlink()


@pytest.mark.parametrize("kind, needs_force", [
    ("random bytes", True), ("truncated", True), ("wrong-typed pids", True),
    ("no processes", False), ("deleted", False)])
def test_down_stops_exactly_the_cluster_whatever_happened_to_the_state(
        state_dir: Path, kind: str, needs_force: bool) -> None:
    base = BASE + 10 * ["random bytes", "truncated", "wrong-typed pids", "no processes",
                        "deleted"].index(kind)
    cdir, _st, pids = _up(f"lose-{base}", base)
    other = _foreign()
    try:
        _damage(kind, cdir)
        if needs_force:
            status = _epdctl(["status", cdir.name])
            assert status.exit_code == 1 and "damaged" in status.output
            assert f"down {cdir.name} --force" in status.output and "Traceback" not in status.output
            refused = _epdctl(["down", cdir.name])
            assert refused.exit_code == 1 and "--force" in refused.output
            assert all(_alive(p) for p in pids)  # nothing was stopped on a guess
        out = _epdctl(["down", cdir.name, *(["--force"] if needs_force else [])])
        assert out.exit_code == 0, out.output
        assert "carries the cluster's marker; stopped" in out.output
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids)
        assert other.poll() is None  # the foreign process never noticed
        assert not cdir.state_file.exists()
        again = _epdctl(["down", cdir.name])
        assert again.exit_code == 0 and "nothing to stop" in again.output
    finally:
        other.kill()
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


@pytest.mark.parametrize("forge", ["pid and create time", "pid, create time and a token"])
def test_a_forged_record_never_kills_a_foreign_process(state_dir: Path, forge: str) -> None:
    base = BASE + 60 + (10 if "token" in forge else 0)
    cdir, st, pids = _up(f"forged-{base}", base)
    other = _foreign()
    try:
        doc = json.loads(cdir.state_file.read_text())
        rec = doc["processes"][0]
        rec["handle"].update(pid=other.pid, pgid=other.pid,
                             create_time=psutil.Process(other.pid).create_time())
        if "token" not in forge:
            rec["handle"]["token"] = None
        cdir.state_file.write_text(json.dumps(doc))
        status = _epdctl(["status", cdir.name, "--json"])
        assert status.exit_code == 1  # the forged row is not this cluster's process: dead
        rows = {w["name"]: w for w in json.loads(status.output)["workers"]}
        assert rows[rec["name"]]["alive"] is False
        out = _epdctl(["down", cdir.name])
        assert out.exit_code == 0, out.output
        time.sleep(0.5)
        assert other.poll() is None, "down killed a process that was not the cluster's"
        assert not any(_alive(p) for p in pids)  # the real worker was found by its marker
    finally:
        other.kill()
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def test_a_killed_up_reads_as_failed_and_down_cleans_it(state_dir: Path, tmp_path: Path) -> None:
    """kill -9 of the process running `up` while a worker is still unhealthy."""
    base = BASE + 90
    gate = tmp_path / "not-yet"
    gate.write_text("x")
    # run as its own python process: tests/conftest.py's import path does not reach it
    script = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_lifecycle import Plan, _worker
from epdctl.orchestrate.lifecycle import BringUp
from epdctl.launchers.local import LocalLauncher
from epdctl.state.store import ClusterDir, ClusterState
plan = Plan([_worker("encoder-0", "encoder", {base + 1}),
             _worker("decode-0", "decode", {base + 2}, "--fail-health-file", {str(gate)!r})], None)
cdir = ClusterDir("halfway")
st = ClusterState(name="halfway", topology="t.yaml", launcher="local")
with cdir.lock("up"):
    cdir.save(st)
    BringUp(LocalLauncher(cdir.root), cdir, st, timeout=300).run(plan)
"""
    up = subprocess.Popen([sys.executable, "-c", script], env={**os.environ})
    cdir = ClusterDir("halfway")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            st = cdir.load() if cdir.exists() else None
            if st is not None and len(st.processes) == 2:
                break
            time.sleep(0.2)
        during = _epdctl(["status", "halfway", "--json"])
        assert json.loads(during.output)["phase"] == "starting"  # `up` still runs: starting
        up.send_signal(signal.SIGKILL)
        up.wait(10)
        after = _epdctl(["status", "halfway"])
        assert after.exit_code == 1
        assert "(failed," in after.output and "`epdctl down halfway`" in after.output
        down = _epdctl(["down", "halfway"])
        assert down.exit_code == 0, down.output
        assert LocalLauncher(cdir.root).orphans() == []
    finally:
        if up.poll() is None:
            up.kill()
        _epdctl(["down", "halfway", "--force"])


def test_two_state_folders_with_one_cluster_name_never_claim_each_other(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path / "a"))
    _cdir, _st, pids_a = _up("same", BASE + 80)
    try:
        monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path / "b"))
        out = _epdctl(["down", "same"])
        assert out.exit_code == 0 and "nothing to stop" in out.output
        assert all(_alive(p) for p in pids_a)
    finally:
        monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path / "a"))
        _epdctl(["down", "same"])
        assert not any(_alive(p) for p in pids_a)
