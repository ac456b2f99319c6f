"""The local launcher with real processes: groups, logs, stop/kill, early exits."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from epdctl.errors import LaunchError
from epdctl.launchers import get_launcher
from epdctl.launchers.base import Handle, LaunchSpec, expand_env, tail
from epdctl.launchers.local import LocalLauncher, resolve_argv


def _spec(name: str, code: str, env: dict[str, str] | None = None) -> LaunchSpec:
    return LaunchSpec(name=name, role="encoder", node="local",
                      argv=("python", "-c", textwrap.dedent(code)), env=env or {})


@pytest.fixture
def launcher():
    lau = LocalLauncher()
    started: list = []
    orig = lau.start

    def tracking_start(spec, log):
        h = orig(spec, log)
        started.append(h)
        return h

    lau.start = tracking_start  # type: ignore[method-assign]
    yield lau
    lau.stop(started, grace=2.0)


def test_start_and_stop_a_process_group(launcher: LocalLauncher, tmp_path: Path) -> None:
    # The leader starts a child (`sleep`) in the same group: stop must take both.
    h = launcher.start(_spec("enc", """
        import subprocess, time, sys
        child = subprocess.Popen(["sleep", "300"])
        print("child", child.pid, flush=True)
        time.sleep(300)
    """), tmp_path / "enc.log")
    assert h.pgid == h.pid and h.pgid != os.getpgid(0)
    assert launcher.is_alive(h)
    child = None
    for _ in range(100):
        lines = [ln for ln in tail(h.log).splitlines() if ln.startswith("child ")]
        if lines:
            child = int(lines[0].split()[1])
            break
        time.sleep(0.05)
    assert child is not None and os.getpgid(child) == h.pgid
    res = launcher.stop([h], grace=5.0)
    assert res.all_ok and list(res.ok) == ["enc"]
    assert not launcher.is_alive(h)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert "=== epdctl: starting enc" in tail(h.log)


def test_sigterm_ignored_then_sigkill(launcher: LocalLauncher, tmp_path: Path) -> None:
    h = launcher.start(_spec("stubborn", """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(300)
    """), tmp_path / "s.log")
    for _ in range(200):
        if "ready" in tail(h.log):
            break
        time.sleep(0.05)
    res = launcher.stop([h], grace=0.5)
    assert res.all_ok
    assert not launcher.is_alive(h)
    assert launcher.exit_code(h) == -9


def test_worker_exiting_at_once_reports_its_log_tail(tmp_path: Path) -> None:
    lau = LocalLauncher(settle=1.0)
    with pytest.raises(LaunchError) as e:
        lau.start(_spec("prefill-0", """
            import sys
            print("loading model from /nope", flush=True)
            sys.exit("error: model path /nope does not exist")
        """), tmp_path / "p.log")
    msg = str(e.value)
    assert "[local/prefill-0] exited with status 1" in msg
    assert "model path /nope does not exist" in msg and "loading model" in msg


def test_raise_if_dead_after_a_later_crash(tmp_path: Path) -> None:
    lau = LocalLauncher(settle=0.0)
    h = lau.start(_spec("dec", """
        import time
        time.sleep(0.3)
        print("boom: port in use", flush=True)
        raise SystemExit(3)
    """), tmp_path / "d.log")
    while lau.is_alive(h):
        time.sleep(0.05)
    with pytest.raises(LaunchError, match=r"(?s)status 3.*boom: port in use"):
        lau.raise_if_dead(h)


def test_stop_never_signals_an_unrecorded_process(tmp_path: Path) -> None:
    """A handle whose pid now belongs to another process (pid reuse) is left alone."""
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        fake = Handle(name="old", role="decode", node="local", pid=other.pid, pgid=other.pid,
                      create_time=psutil.Process(other.pid).create_time() + 100.0,
                      log=tmp_path / "x.log", since=0.0, argv=("x",))
        lau = LocalLauncher()
        assert not lau.is_alive(fake)
        assert lau.stop([fake], grace=0.2).all_ok
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_env_is_expanded_at_launch(launcher: LocalLauncher, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPDCTL_TEST_SECRET", "s3cret")
    h = launcher.start(_spec("env", """
        import os, time
        print("got", os.environ["ROUTER_KEY"], flush=True)
        time.sleep(300)
    """, env={"ROUTER_KEY": "${EPDCTL_TEST_SECRET}"}), tmp_path / "e.log")
    for _ in range(200):
        if "got" in tail(h.log):
            break
        time.sleep(0.05)
    assert "got s3cret" in tail(h.log)


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
