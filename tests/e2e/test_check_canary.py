"""`epdctl check --canary` on a real local cluster: every E->P and P->D pair moves bytes that the
workers' own /metrics count, and a pair that cannot (an encoder killed behind epdctl's back) is
named and fails the check.

Own cluster (not the session one): ports 30800-30899, its own EPDCTL_STATE_DIR, so it can be
broken at the end without disturbing other tests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
NAME = "canarypairs"
BASE = 30800


class Live:
    def __init__(self, tmp: Path):
        src = ROOT / "topologies" / "local.yaml"
        doc = yaml.safe_load(src.read_text())
        doc["name"] = NAME
        doc["ports"] = {"base": BASE, "limit": BASE + 99}
        doc["model"]["path"] = str((src.parent / doc["model"]["path"]).resolve())
        self.topology = tmp / "canary.yaml"
        self.topology.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp / "state"))
        self.up_output = ""

    def epdctl(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "epdctl", *args], env=self.env, cwd=ROOT,
                              text=True, capture_output=True, timeout=900)

    def state(self) -> dict[str, Any]:
        path = Path(self.env["EPDCTL_STATE_DIR"]) / "clusters" / NAME / "state.json"
        return json.loads(path.read_text())


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    c = Live(tmp_path_factory.mktemp("canary"))
    up = c.epdctl("up", str(c.topology), "--timeout", "600")
    c.up_output = up.stdout + up.stderr
    try:
        assert up.returncode == 0, f"epdctl up failed:\n{c.up_output}"
        yield c
    finally:
        down = c.epdctl("down", NAME)
        assert down.returncode == 0, down.stdout + down.stderr


def test_up_ran_the_preflight_and_counted_canary_bytes(live: Live) -> None:
    out = live.up_output
    assert "preflight:" in out and "node checks passed" in out, out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("transfers:"))
    assert "prefill-0 received" in line and "decode-0 received" in line, line
    assert "encoder-" in line and " sent " in line, line


def test_check_canary_lists_every_pair_with_bytes(live: Live) -> None:
    proc = live.epdctl("check", "--canary", NAME, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    pairs = {p["pair"]: p for p in doc["pairs"]}
    want = {"encoder-0->prefill-0", "encoder-1->prefill-0", "prefill-0->decode-0"}
    assert set(pairs) == want, pairs
    for p in pairs.values():
        assert p["ok"] and p["sent"] > 0 and p["received"] > 0, p
    assert pairs["prefill-0->decode-0"]["kind"] == "P->D"
    assert pairs["prefill-0->decode-0"]["correct"] >= 1
    assert doc["ok"] is True and doc["cluster"] == NAME

    table = live.epdctl("check", "--canary", str(live.topology))  # a topology file works too
    assert table.returncode == 0, table.stdout + table.stderr
    for label in want:
        assert label in table.stdout
    assert "all 3 pairs moved data" in table.stdout


def test_a_dead_encoder_is_named(live: Live) -> None:
    rec = next(p for p in live.state()["processes"] if p["name"] == "encoder-1")
    os.killpg(rec["pgid"], signal.SIGKILL)  # behind epdctl's back
    proc = live.epdctl("check", "--canary", NAME)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    bad = [ln for ln in proc.stdout.splitlines() if "FAIL" in ln]
    assert len(bad) == 1 and "encoder-1->prefill-0" in bad[0], proc.stdout
    assert "1 pair(s) failed: encoder-1->prefill-0" in proc.stdout
