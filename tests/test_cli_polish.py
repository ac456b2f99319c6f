"""CLI polish: closed sets are click choices, shell completion works through the real entry point."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from epdctl.cli import cli
from epdctl.state.store import ClusterDir, ClusterState

ROOT = Path(__file__).resolve().parents[1]


def _complete(words: str, tmp: Path) -> list[str]:
    env = dict(os.environ, _EPDCTL_COMPLETE="bash_complete", COMP_WORDS=words,
               COMP_CWORD=str(len(words.split(" ")) - 1), EPDCTL_STATE_DIR=str(tmp),
               PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "epdctl"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [line.split(",", 1)[1] for line in out.stdout.splitlines()]


def test_launcher_is_a_choice() -> None:
    r = CliRunner().invoke(cli, ["up", "--launcher", "kubernetes", "x.yaml"])
    assert r.exit_code == 2 and "'kubernetes' is not one of 'local', 'ssh', 'slurm'" in r.output


def test_completion_of_commands_choices_and_cluster_names(tmp_path: Path) -> None:
    assert "status" in _complete("epdctl st", tmp_path) and "schema" in _complete("epdctl s", tmp_path)
    assert _complete("epdctl up --launcher ", tmp_path) == ["local", "ssh", "slurm"]
    assert _complete("epdctl render x.yaml --format ", tmp_path) == ["sh", "json"]
    ClusterDir("alpha", tmp_path).save(ClusterState(name="alpha", topology="t.yaml", launcher="local"))
    ClusterDir("beta", tmp_path).save(ClusterState(name="beta", topology="t.yaml", launcher="local"))
    assert _complete("epdctl status a", tmp_path) == ["alpha"]
    assert _complete("epdctl down ", tmp_path) == ["alpha", "beta"]


def test_bash_completion_script_is_generated() -> None:
    env = dict(os.environ, _EPDCTL_COMPLETE="bash_source", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "epdctl"], env=env, capture_output=True, text=True, timeout=60)
    assert "_epdctl_completion" in out.stdout and "complete -o nosort -F" in out.stdout
