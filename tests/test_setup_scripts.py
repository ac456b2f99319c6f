"""scripts/pip_quiet.sh: pip's resolver report about the --no-deps engine installs (recorded real
output) becomes one line, other output stays, and pip's exit status is kept."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "fixtures" / "pip" / "resolver_conflicts.txt"


def _run(tmp: Path, rc: int, extra: str = "") -> subprocess.CompletedProcess:
    out = "".join(line for line in RECORDED.read_text().splitlines(keepends=True) if not line.startswith("# "))
    (tmp / "pip-output.txt").write_text(out + extra)
    py = tmp / ".venv" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text(f"#!/bin/sh\ncat {tmp / 'pip-output.txt'}\nexit {rc}\n")
    py.chmod(0o755)
    return subprocess.run(["bash", "-c", f"set -euo pipefail; source {ROOT / 'scripts' / 'pip_quiet.sh'}; "
                                         "pip_install x; echo after"], cwd=tmp, capture_output=True, text=True)


def test_conflict_report_becomes_one_line(tmp_path: Path) -> None:
    proc = _run(tmp_path, 0)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    n = sum(" requires " in x for x in RECORDED.read_text().splitlines())
    assert n > 30 and lines == [f"setup: pip lists {n} unmet requirement(s) of the --no-deps engine installs "
                                f"(sglang/vllm); expected: only their argument parsers are used (details: "
                                f".venv/pip-install.log)", "after"], lines
    assert "which is not installed" in (tmp_path / ".venv" / "pip-install.log").read_text()


def test_real_errors_are_shown_and_stop_the_setup(tmp_path: Path) -> None:
    proc = _run(tmp_path, 1, "ERROR: No matching distribution found for torch==9.9\n")
    assert proc.returncode == 1 and "after" not in proc.stdout
    assert "ERROR: No matching distribution found for torch==9.9" in proc.stdout
