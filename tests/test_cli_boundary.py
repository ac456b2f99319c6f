"""The CLI's single error boundary: an EpdctlError is its message and exit 1; any unexpected
exception is one line naming the debug log (in the state dir) that holds the traceback, never a
traceback on the terminal, even when the state dir cannot be written or the text cannot encode.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from epdctl.cli import main
from epdctl.errors import EpdctlError

ROOT = Path(__file__).resolve().parents[1]
TOPO = str(ROOT / "topologies" / "local.yaml")


def _boom(*_: object) -> None:
    raise ZeroDivisionError("boom\nsecond line of the message")


def _run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, exc: object = _boom) -> str:
    import epdctl.commands.validate as validate

    monkeypatch.setattr(validate, "load_topology", exc)
    with pytest.raises(SystemExit) as info:
        main(["validate", TOPO])
    assert info.value.code == 1
    return capsys.readouterr().err


def test_unexpected_error_is_one_line_naming_the_debug_log(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path / "state"))
    err = _run(monkeypatch, capsys)
    log = tmp_path / "state" / "debug.log"
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "unexpected internal error (ZeroDivisionError: boom)" in err and str(log) in err
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "ZeroDivisionError: boom" in text and "validate" in text
    assert oct(log.stat().st_mode & 0o777) == "0o600"
    _run(monkeypatch, capsys)  # a second error is appended
    assert log.read_text().count("=== ") == 2


def test_unwritable_state_dir_falls_back_to_the_temp_dir(tmp_path, monkeypatch, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(blocker / "state"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    err = _run(monkeypatch, capsys)
    assert f"epdctl-debug-{os.getuid()}.log" in err and "Traceback" not in err


def test_epdctl_error_is_its_message(tmp_path, monkeypatch, capsys) -> None:
    def fail(_: object) -> None:
        raise EpdctlError("node n1: something went wrong; do this")
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path))
    err = _run(monkeypatch, capsys, fail)
    assert "node n1: something went wrong; do this" in err and not (tmp_path / "debug.log").exists()


def test_text_that_cannot_be_printed_is_still_one_line(tmp_path, monkeypatch, capsys) -> None:
    """A lone surrogate in a message breaks click's printing; the boundary still answers one line."""
    def fail(_: object) -> None:
        raise EpdctlError("node n\udc80: something went wrong")
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path))
    err = _run(monkeypatch, capsys, fail)
    assert err.count("\n") == 1 and "Traceback" not in err and "\\udc80" in err


def test_a_real_process_never_shows_a_traceback(tmp_path) -> None:
    code = ("import epdctl.commands.validate as v\n"
            "v.load_topology = lambda p: {}['missing']\n"
            "from epdctl.cli import main\n"
            f"main(['validate', {TOPO!r}])\n")
    env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "KeyError: 'missing'" in proc.stderr and str(tmp_path / "debug.log") in proc.stderr
