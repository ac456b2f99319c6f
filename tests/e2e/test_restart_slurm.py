"""kill -9 under load on SLURM: the step's supervisor restarts the worker inside its step.

The real local SLURM cluster (tests/slurm_cluster.py); topologies/slurm-local.yaml with
``restart: {policy: on-failure, backoff: 1.0}`` started by `epdctl up` from the login node
(epdctl submits and owns the allocation), real runtime workers (torch) as job steps and the
real smg router. Each role's worker in turn (the router too) is killed with SIGKILL while a
client sends image requests through the router (tests/e2e/kill9_load.py): the step, the
allocation and the other steps live on, the service comes back by itself, and `status` shows
restarts=1, the cause and the allocation RUNNING. The outage is printed (run with -s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from kill9_load import kill_under_load
from slurm_cluster import SlurmCluster, slurm_cluster

from epdctl.launchers.slurm import jobs

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "topologies" / "slurm-local.yaml"
NAME = "slurm-local"
ROUTER = "http://127.0.0.1:37101"


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    yield from slurm_cluster()


class Cluster:
    def __init__(self, tmp: Path):
        doc = yaml.safe_load(SRC.read_text())
        doc["model"]["path"] = str((SRC.parent / doc["model"]["path"]).resolve())
        doc["restart"] = {"policy": "on-failure", "limit": 5, "backoff": 1.0}
        self.topology = tmp / "slurm-local.yaml"
        self.topology.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.state = tmp / "state"
        self.env = dict(os.environ, EPDCTL_STATE_DIR=str(self.state), PYTHONPATH=str(ROOT))
        self.env.pop("SLURM_JOB_ID", None)  # from the login node: epdctl submits its own job

    def epdctl(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "epdctl", *args], env=self.env, cwd=ROOT,
                              text=True, capture_output=True, timeout=300)

    def pid_file(self, worker: str) -> dict[str, Any]:
        try:
            return json.loads((self.state / "clusters" / NAME / "run" / f"{worker}.pid.json")
                              .read_text())
        except (OSError, ValueError):
            return {}


@pytest.fixture(scope="module")
def cluster(slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("restart-slurm"))
    up = c.epdctl("up", str(c.topology), "--timeout", "300", "--no-canary")
    try:
        assert up.returncode == 0, f"epdctl up failed:\n{up.stdout}\n{up.stderr}"
        assert f"OpenAI endpoint: {ROUTER}/v1" in up.stdout, up.stdout  # not a placeholder host
        yield c
    finally:
        down = c.epdctl("down", NAME)
        assert down.returncode == 0, down.stdout + down.stderr


@pytest.mark.parametrize("worker", ["encoder-0", "prefill-0", "decode-0", "router"])
def test_kill_9_on_slurm_recovers_inside_its_step(cluster: Cluster, worker: str) -> None:
    st = json.loads((cluster.state / "clusters" / NAME / "state.json").read_text())
    step = next(p["handle"] for p in st["processes"] if p["name"] == worker)
    got = kill_under_load(ROUTER, lambda: cluster.pid_file(worker))
    print(f"\nslurm {worker}: service back {got.outage_s:.1f}s after kill -9 "
          f"({got.failed_between} failed request(s) in between)")
    assert got.pid_doc["last_exit"] == "killed by signal 9 (SIGKILL)"
    status = cluster.epdctl("status", NAME, "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    doc = json.loads(status.stdout)
    assert doc["phase"] == "running" and doc["allocation"]["state"] == "RUNNING"
    assert jobs.poll([step["job"]])[step["job"]].state == "RUNNING"
    row = next(w for w in doc["workers"] if w["name"] == worker)
    assert row["restarts"] == 1 and row["last_exit"] == "killed by signal 9 (SIGKILL)", row
    assert row["alive"] and row["healthy"]
    st = json.loads((cluster.state / "clusters" / NAME / "state.json").read_text())
    assert next(p["handle"] for p in st["processes"] if p["name"] == worker) == step
