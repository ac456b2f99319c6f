"""`epdctl status` shows bench's key figures, read from a real cluster's `/metrics` pages.

The cluster is this module's own (`epdctl up` on a copy of topologies/local.yaml with ports
moved to 30000-30099 and a tmp EPDCTL_STATE_DIR); traffic comes from `epdctl bench`, and the
cluster is stopped with `epdctl down` at the end.
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

from own_cluster import local_copy

ROOT = Path(__file__).resolve().parents[2]
BASE = 30000
NAME = "figures-e2e"


class Env:
    def __init__(self, tmp: Path):
        doc = local_copy(NAME, BASE)
        self.topology = tmp / f"{NAME}.yaml"
        self.topology.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp / "state"))

    def epdctl(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "epdctl", *args], env=self.env, cwd=ROOT,
                              text=True, capture_output=True, timeout=timeout)

    def status(self) -> tuple[int, dict[str, Any]]:
        proc = self.epdctl("status", NAME, "--json", timeout=120)
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc.returncode, json.loads(proc.stdout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    e = Env(tmp_path_factory.mktemp("figures"))
    up = e.epdctl("up", str(e.topology), "--timeout", "600", "--no-canary")
    try:
        assert up.returncode == 0, f"epdctl up failed:\n{up.stdout}\n{up.stderr}"
        bench = e.epdctl("bench", NAME, "--images", "1-2", "--repeat", "0.5", "--concurrency",
                         "2", "--requests", "4", "--max-tokens", "8", "--quiet")
        assert bench.returncode == 0, bench.stdout + bench.stderr
        yield e
    finally:
        down = e.epdctl("down", NAME)
        assert down.returncode == 0, down.stdout + down.stderr


def test_status_json_has_figures(cluster: Env) -> None:
    rc, doc = cluster.status()
    assert rc == 0, doc
    fig = {w["name"]: w["figures"] for w in doc["workers"]}
    assert fig["decode-0"]["requests"] == 4
    assert 0 < fig["decode-0"]["ttft_p50_ms"] <= fig["decode-0"]["ttft_p99_ms"]
    assert fig["decode-0"]["tpot_p50_ms"] > 0
    assert fig["prefill-0"]["requests"] == 4 and fig["prefill-0"]["bytes_sent"] > 0  # KV
    roles = doc["figures"]["roles"]
    assert doc["figures"]["cumulative_since_start"] is True
    enc = roles["encoder"]
    assert enc["workers"] == 2 and enc["requests"] > 0 and enc["bytes_sent"] > 0
    assert 0 <= enc["cache_hit_rate"] <= 1
    assert enc["requests"] == sum(fig[f"encoder-{i}"]["requests"] for i in (0, 1))
    assert roles["decode"]["requests"] == 4
    router = doc["figures"]["router"]
    assert router["requests"] >= 4 and router["ttft_p50_ms"] > 0


def test_status_table_and_dead_worker_dash(cluster: Env) -> None:
    proc = cluster.epdctl("status", NAME, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "figures (cumulative since each process started" in proc.stdout
    assert "TTFT p50/p99 ms" in proc.stdout and "all encoder (2)" in proc.stdout
    # a worker whose /metrics cannot answer shows "-" and status still reports
    state = json.loads((Path(cluster.env["EPDCTL_STATE_DIR"]) / "clusters" / NAME
                        / "state.json").read_text())
    pid = next(p["handle"]["pid"] for p in state["processes"] if p["name"] == "encoder-1")
    os.kill(pid, signal.SIGKILL)
    rc, doc = cluster.status()
    assert rc == 1  # a dead worker makes status fail as before, but it answers
    fig = {w["name"]: w["figures"] for w in doc["workers"]}
    assert fig["encoder-1"] is None and fig["encoder-0"]["requests"] is not None
    assert doc["figures"]["roles"]["encoder"]["workers"] == 1
    table = cluster.epdctl("status", NAME, timeout=120).stdout
    row = next(ln for ln in table.splitlines()
               if ln.startswith("encoder-1") and "encoder" not in ln[9:])
    assert row.split()[1:] == ["-"] * 5
