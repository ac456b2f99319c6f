"""The local launcher with real processes: groups, logs, stop/kill, early exits, environment."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from epdctl.errors import LaunchError
from epdctl.launchers import get_launcher
from epdctl.launchers.base import expand_env, tail, worker_env
from epdctl.launchers.local import LocalLauncher, resolve_argv
from epdctl.state.store import Handle, ProcessRecord


def _rec(name: str, code: str, log: Path, env: dict[str, str] | None = None) -> ProcessRecord:
    return ProcessRecord(name=name, role="encoder", node="local",
                         argv=["python", "-c", textwrap.dedent(code)], env=env or {}, log=str(log))


def _start(lau: LocalLauncher, rec: ProcessRecord) -> ProcessRecord:
    res = lau.start([rec])
    res.raise_if_failed("start")
    rec.handle = res.ok[rec.name]
    return rec


def _alive(lau: LocalLauncher, rec: ProcessRecord) -> bool:
    return lau.poll([rec]).ok[rec.name].alive


@pytest.fixture
def launcher():
    lau = LocalLauncher()
    started: list[ProcessRecord] = []
    orig = lau.start

    def tracking_start(recs):
        res = orig(recs)
        for r in recs:
            if r.name in res.ok:
                started.append(ProcessRecord(r.name, r.role, r.node, handle=res.ok[r.name]))
        return res

    lau.start = tracking_start  # type: ignore[method-assign]
    yield lau
    lau.stop(started, grace=2.0)


def test_start_and_stop_a_process_group(launcher: LocalLauncher, tmp_path: Path) -> None:
    # The leader starts a child (`sleep`) in the same group: stop must take both.
    rec = _start(launcher, _rec("enc", """
        import subprocess, time, sys
        child = subprocess.Popen(["sleep", "300"])
        print("child", child.pid, flush=True)
        time.sleep(300)
    """, tmp_path / "enc.log"))
    h = rec.handle
    assert h is not None and h.pgid == h.pid and h.pgid != os.getpgid(0)
    assert _alive(launcher, rec)
    child = None
    for _ in range(100):
        lines = [ln for ln in tail(Path(rec.log)).splitlines() if ln.startswith("child ")]
        if lines:
            child = int(lines[0].split()[1])
            break
        time.sleep(0.05)
    assert child is not None and os.getpgid(child) == h.pgid
    res = launcher.stop([rec], grace=5.0)
    assert res.all_ok and list(res.ok) == ["enc"]
    assert not _alive(launcher, rec)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert "=== epdctl: starting enc" in launcher.logs(rec)


def test_sigterm_ignored_then_sigkill(launcher: LocalLauncher, tmp_path: Path) -> None:
    rec = _start(launcher, _rec("stubborn", """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(300)
    """, tmp_path / "s.log"))
    for _ in range(200):
        if "ready" in tail(Path(rec.log)):
            break
        time.sleep(0.05)
    res = launcher.stop([rec], grace=0.5)
    assert res.all_ok
    st = launcher.poll([rec]).ok["stubborn"]
    assert not st.alive and st.exit_code == -9


def test_worker_exiting_at_once_reports_its_log_tail_and_the_rest_start(tmp_path: Path) -> None:
    lau = LocalLauncher()
    lau.settle = 1.0
    res = lau.start([
        _rec("prefill-0", """
            import sys
            print("loading model from /nope", flush=True)
            sys.exit("error: model path /nope does not exist")
        """, tmp_path / "p.log"),
        _rec("decode-0", "import time; time.sleep(300)", tmp_path / "d.log")])
    try:
        msg = str(res.failed["prefill-0"])
        assert "[local/prefill-0] exited with status 1" in msg
        assert "model path /nope does not exist" in msg and "loading model" in msg
        assert list(res.ok) == ["decode-0"]  # one failure never hides the others
    finally:
        assert lau.stop([ProcessRecord("decode-0", "decode", "local", handle=res.ok["decode-0"])],
                        grace=2).all_ok


def test_poll_after_a_later_crash_has_status_and_log_tail(tmp_path: Path) -> None:
    lau = LocalLauncher()
    lau.settle = 0.0
    rec = _start(lau, _rec("dec", """
        import time
        time.sleep(0.3)
        print("boom: port in use", flush=True)
        raise SystemExit(3)
    """, tmp_path / "d.log"))
    while _alive(lau, rec):
        time.sleep(0.05)
    st = lau.poll([rec]).ok["dec"]
    assert st.exit_code == 3 and "boom: port in use" in st.tail


def test_stop_never_signals_an_unrecorded_process(tmp_path: Path) -> None:
    """A handle whose pid now belongs to another process (pid reuse) is left alone."""
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        fake = ProcessRecord("old", "decode", "local", log=str(tmp_path / "x.log"), handle=Handle(
            pid=other.pid, pgid=other.pid,
            create_time=psutil.Process(other.pid).create_time() + 100.0))
        lau = LocalLauncher()
        assert not _alive(lau, fake)
        assert lau.stop([fake], grace=0.2).all_ok
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_the_token_not_the_clock_names_the_group_after_the_clock_steps_back(
        tmp_path: Path) -> None:
    """psutil's create_time follows the wall clock (btime = now - uptime): after an NTP step
    back our own process reads as created seconds (or hours) before its record. A handle
    whose create_time lies later than the process's, with the recorded token, is still ours
    (poll says alive, stop stops it); the same handle with another token is not (a forged or
    stale record), and neither is the process's group under a handle without a token."""
    lau = LocalLauncher()
    lau.settle = 0.0
    rec = _start(lau, _rec("stepped", "import time; time.sleep(300)", tmp_path / "s.log"))
    assert rec.handle is not None
    true_handle = rec.handle
    try:
        for jump in (1.0, 3.0, 3600.0):
            rec.handle = replace(true_handle, create_time=true_handle.create_time + jump)
            assert _alive(lau, rec), jump
        rec.handle = replace(true_handle, token="0" * len(true_handle.token or "x"))
        assert not _alive(lau, rec)
        assert lau.stop([rec], grace=0.2).all_ok
        assert psutil.Process(true_handle.pid).status() != psutil.STATUS_ZOMBIE
        rec.handle = replace(true_handle, token=None)
        assert not _alive(lau, rec)
        rec.handle = replace(true_handle, create_time=true_handle.create_time + 3600.0)
        assert lau.stop([rec], grace=2.0).all_ok
        assert not psutil.pid_exists(true_handle.pid) or \
            psutil.Process(true_handle.pid).status() == psutil.STATUS_ZOMBIE
    finally:
        rec.handle = true_handle
        lau.stop([rec], grace=0.5)


def test_env_is_expanded_at_launch_and_the_shell_is_not_inherited(
        launcher: LocalLauncher, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The topology's ${VAR} reaches the worker; another secret of the launching shell does not
    (read back from the worker's own /proc/PID/environ)."""
    monkeypatch.setenv("EPDCTL_TEST_SECRET", "s3cret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "operator-only-7f3a")
    rec = _start(launcher, _rec("env", """
        import os, time
        print("got", os.environ["ROUTER_KEY"], flush=True)
        time.sleep(300)
    """, tmp_path / "e.log", env={"ROUTER_KEY": "${EPDCTL_TEST_SECRET}"}))
    for _ in range(200):
        if "got" in tail(Path(rec.log)):
            break
        time.sleep(0.05)
    assert "got s3cret" in tail(Path(rec.log))
    assert rec.handle is not None
    environ = Path(f"/proc/{rec.handle.pid}/environ").read_bytes().split(b"\0")
    names = {e.split(b"=", 1)[0].decode() for e in environ if e}
    assert b"AWS_SECRET_ACCESS_KEY=operator-only-7f3a" not in environ
    assert "AWS_SECRET_ACCESS_KEY" not in names
    assert {"PATH", "ROUTER_KEY", "PYTHONUNBUFFERED"} <= names


def test_worker_env_is_the_documented_base_plus_the_topology() -> None:
    shell = {"PATH": "/bin", "HOME": "/root", "LANG": "C.UTF-8", "GITHUB_TOKEN": "t",
             "NCCL_DEBUG": "INFO", "EPDCTL_STATE_DIR": "/s", "MY_KEY": "k"}
    env = worker_env({"API": "${MY_KEY}"}, "router", source=shell)
    assert env == {"PATH": "/bin", "HOME": "/root", "LANG": "C.UTF-8", "NCCL_DEBUG": "INFO",
                   "EPDCTL_STATE_DIR": "/s", "API": "k", "PYTHONUNBUFFERED": "1"}


def test_missing_env_var_names_it() -> None:
    with pytest.raises(LaunchError, match="NOPE_VAR.*not set"):
        expand_env({"K": "${NOPE_VAR}"}, "router", source={})


def test_resolve_argv() -> None:
    assert resolve_argv(("python", "-m", "x")) == [sys.executable, "-m", "x"]
    assert resolve_argv(("smg", "launch"))[0].endswith("smg")
    with pytest.raises(LaunchError, match="not found"):
        resolve_argv(("no-such-tool-xyz",))


def test_registry() -> None:
    assert isinstance(get_launcher("local"), LocalLauncher)
    with pytest.raises(LaunchError, match="unknown launcher 'ssh2'.*local"):
        get_launcher("ssh2")


def test_the_api_key_variable_a_command_names_reaches_it() -> None:
    """Env hygiene keeps the operator's variables away from workers, except the one a worker's
    ``--api-key-env NAME`` (or the router wrapper) is told to read."""
    from epdctl.render import build_plan
    from epdctl.topology import topology_from_text

    path = Path(__file__).resolve().parents[1] / "topologies" / "local.yaml"
    text = path.read_text().replace("router:\n", "router:\n  api_key_env: CLUSTER_KEY\n", 1)
    plan = build_plan(topology_from_text(text, path))
    # the plan names the variable each process reads: every embedded worker, the router's wrapper
    assert plan.router is not None and plan.router.key_vars == ("CLUSTER_KEY",)
    assert {w.key_vars for w in plan.workers} == {("CLUSTER_KEY",)}
    shell = {"PATH": "/bin", "CLUSTER_KEY": "k", "OTHER_SECRET": "s"}
    env = worker_env({}, "decode-0", source=shell, keys=plan.workers[-1].key_vars)
    assert env == {"PATH": "/bin", "CLUSTER_KEY": "k", "PYTHONUNBUFFERED": "1"}
    assert "CLUSTER_KEY" not in worker_env({}, "decode-0", source=shell)
