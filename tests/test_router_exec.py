"""`python -m epdctl.node.router_exec VAR MODULE FLAGS...`: the router gets `--api-key` from $VAR
in-process; the key is never on the kernel's command line, and a missing variable is one line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ECHO = ("import os, sys, time\n"
        "print('argv', sys.argv[1:], flush=True)\n"
        "print('cmdline', open(f'/proc/{os.getpid()}/cmdline', 'rb').read().split(b'\\0'), flush=True)\n")


def _run(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "fake_router.py").write_text(ECHO)
    return subprocess.run(
        [sys.executable, "-m", "epdctl.node.router_exec", "ROUTER_KEY_T", "fake_router", "--port", "1"],
        capture_output=True, text=True, timeout=60,
        env={**env, "PYTHONPATH": f"{tmp_path}:{ROOT}"})


def test_the_key_reaches_the_router_but_no_command_line(tmp_path: Path) -> None:
    out = _run(tmp_path, dict(os.environ, ROUTER_KEY_T="k3y-v4lue-9"))
    assert out.returncode == 0, out.stderr
    argv_line, cmd_line = out.stdout.splitlines()[:2]
    assert argv_line == "argv ['--port', '1', '--api-key', 'k3y-v4lue-9']"
    assert "k3y-v4lue-9" not in cmd_line and "ROUTER_KEY_T" in cmd_line


def test_a_missing_key_variable_is_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ROUTER_KEY_T"}
    t0 = time.monotonic()
    out = _run(tmp_path, env)
    assert out.returncode == 1 and time.monotonic() - t0 < 30
    assert out.stderr.strip() == ("error: environment variable ROUTER_KEY_T (router API key) is "
                                  "empty or not set")
