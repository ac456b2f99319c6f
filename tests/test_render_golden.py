"""Rendered output of every example topology (sh + json, whole plan and per node) equals the
committed golden files. Regenerate after an intended change with:

    EPDCTL_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/test_render_golden.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from epdctl.render import build_plan, to_json, to_shell
from epdctl.topology import load_topology

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
TOPOLOGIES = sorted((ROOT / "topologies").glob("*.yaml"))
REGEN = os.environ.get("EPDCTL_REGEN_GOLDEN") == "1"


def _normalise(text: str) -> str:
    """Repository-relative: local.yaml's model path is resolved against the checkout; the venv's
    base interpreter, which local-container.yaml mounts, is this machine's."""
    base = sys.base_prefix
    return text.replace(str(ROOT), "<REPO>").replace(f"{base}:{base}:ro", "<BASE_PYTHON>:<BASE_PYTHON>:ro")


def _renders(path: Path) -> dict[str, str]:
    plan = build_plan(load_topology(path))
    out = {f"{path.stem}.sh": to_shell(plan), f"{path.stem}.json": to_json(plan)}
    for node in plan.nodes:
        out[f"{path.stem}/{node}.sh"] = to_shell(plan, node)
    return {k: _normalise(v) for k, v in out.items()}


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_render_matches_golden(path: Path) -> None:
    for name, text in _renders(path).items():
        golden = GOLDEN / name
        if REGEN:
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(text, encoding="utf-8")
            continue
        assert golden.exists(), f"missing {golden}; run EPDCTL_REGEN_GOLDEN=1 pytest {__file__}"
        assert text == golden.read_text(encoding="utf-8"), (
            f"{name} differs from {golden}; if intended, regenerate with EPDCTL_REGEN_GOLDEN=1")


def test_render_is_deterministic() -> None:
    for path in TOPOLOGIES:
        assert _renders(path) == _renders(path)


def test_cli_render_matches_library(tmp_path: Path) -> None:
    """`epdctl render` prints the same text, and --out writes a file per node plus the plan."""
    topo = ROOT / "topologies" / "qwen2vl-epd.yaml"
    run = lambda *a: subprocess.run([sys.executable, "-m", "epdctl", *a], capture_output=True, text=True,  # noqa: E731
                                    timeout=120)
    proc = run("render", str(topo), "--node", "d0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == to_shell(build_plan(load_topology(topo)), "d0")
    proc = run("render", str(topo), "--format", "json", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["d0.json", "e0.json", "p0.json", "plan.json"]
    data = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert [w["name"] for w in data["workers"]][:2] == ["encoder-0", "encoder-1"]
    proc = run("render", str(topo), "--node", "nope")
    assert proc.returncode == 1 and "runs nothing" in proc.stderr
