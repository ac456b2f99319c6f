"""`epdctl up` runs the node preflight first: a failing node check stops it before anything
starts, --force launches anyway, --skip-preflight does not check at all.

The failing check is real: the node declares 64 GPUs, which no machine running these tests has
(`nvidia-smi` is missing or lists fewer). To see that `up` went past the gate without starting a
cluster, a planned port is held open so `up`'s own port check stops it right after.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from click.testing import CliRunner

from epdctl.cli import cli
from epdctl.state.store import ClusterDir

ROOT = Path(__file__).resolve().parents[1]
BASE = 30600  # this file's ports: 30600-30699


@pytest.fixture()
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _topology(tmp_path: Path, gpus: int) -> Path:
    src = ROOT / "topologies" / "local.yaml"
    doc = yaml.safe_load(src.read_text())
    doc["ports"] = {"base": BASE, "limit": BASE + 99}
    doc["model"]["path"] = str((src.parent / doc["model"]["path"]).resolve())
    if gpus:
        doc["nodes"][0]["gpus"] = gpus
    out = tmp_path / "local.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


@pytest.fixture()
def held_port() -> Iterator[int]:
    """A planned port (the first worker's) held open, so `up` stops at its own port check."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", BASE))
        s.listen(1)
        yield BASE


def _up(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, ["up", *args])
    text = res.output + (str(res.exception) if res.exception else "")
    return res.exit_code, text


def test_failing_node_check_refuses_and_starts_nothing(state_dir: Path, tmp_path: Path) -> None:
    code, text = _up(str(_topology(tmp_path, gpus=64)))
    assert code != 0
    assert "[local] gpus:" in text and "64" in text and "node checks failed" in text
    assert "nothing was started" in text and "--force" in text
    assert ClusterDir("local").load() is None
    assert not any(ClusterDir("local").log_dir.glob("*.log"))


def test_force_launches_past_a_failing_check(state_dir: Path, tmp_path: Path,
                                             held_port: int) -> None:
    code, text = _up(str(_topology(tmp_path, gpus=64)), "--force")
    assert code != 0
    assert "[local] gpus:" in text and "--force: launching anyway" in text
    # past the gate: `up`'s own port check is what stopped it
    assert "ports already in use" in text and f"127.0.0.1:{held_port}" in text


def test_skip_preflight_does_not_check(state_dir: Path, tmp_path: Path, held_port: int) -> None:
    code, text = _up(str(_topology(tmp_path, gpus=64)), "--skip-preflight")
    assert code != 0
    assert "preflight: skipped" in text and "gpus" not in text
    assert "ports already in use" in text


def test_passing_preflight_leaves_busy_ports_to_ups_own_check(state_dir: Path, tmp_path: Path,
                                                              held_port: int) -> None:
    code, text = _up(str(_topology(tmp_path, gpus=0)))
    assert code != 0
    assert "node checks passed" in text
    assert "ports already in use" in text and f"127.0.0.1:{held_port}" in text
    assert ClusterDir("local").load() is None
