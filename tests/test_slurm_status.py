"""`status` of a SLURM cluster tells the allocation's truth; a refused `up` leaves nothing.

Real local SLURM (tests/slurm_cluster.py), the real CLI in a subprocess, trivial HTTP workers
(no torch) as job steps of an allocation epdctl submitted:
- a cancelled allocation never reads "running": `status` shows the job's state, says why it
  ended, and names the worker whose step ended for good first;
- `up --timeout` bounds the wait in the queue: the job is cancelled, nothing is recorded, and a
  later `status` says plainly that no cluster is recorded.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import psutil
import jsonschema
import pytest
import yaml

from slurm_cluster import SlurmCluster, slurm_cluster
from test_slurm_jobs import _bring_up, _cheap_plan, ok_server

from epdctl.launchers.slurm import jobs
from epdctl.launchers.slurm.launcher import ALLOC_FILE
from epdctl.state.store import ClusterDir

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "docs" / "status.schema.json").read_text())


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    yield from slurm_cluster()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epdctl", *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT, timeout=300)


def _wait(pred, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.2)


def test_cancelled_allocation_is_failed_with_its_state_and_the_first_worker_to_end(
        cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path / "state"))
    topo, plan = _cheap_plan({"encoder": ok_server("n0.slurm", 37100),
                              "prefill": ok_server("n1.slurm", 37200),
                              "decode": ok_server("n2.slurm", 37300)})
    plan = dataclasses.replace(plan, restart={**plan.restart, "prefill": {"policy": "never"}})
    name = "slurm-local-ended"
    cdir, state, lau, up = _bring_up(topo, plan, name)
    up.run(plan)
    job = state.processes[0].handle.job  # type: ignore[union-attr]
    try:
        pid_file = cdir.root / "run" / "prefill-0.pid.json"
        _wait(lambda: json.loads(pid_file.read_text())["state"] == "running")
        psutil.Process(json.loads(pid_file.read_text())["child_pid"]).kill()
        _wait(lambda: not lau.poll(state.processes).ok["prefill-0"].alive)

        st = cli("status", name, "--json")  # the allocation still runs: one dead worker
        assert st.returncode == 1 and "Traceback" not in st.stderr, st.stderr
        doc = json.loads(st.stdout)
        jsonschema.validate(doc, SCHEMA)
        assert doc["phase"] == "running" and doc["problem"] == ""
        assert doc["allocation"] == {"job": job, "state": "RUNNING", "detail": "", "owned": True}
        text = cli("status", name)   # the job id for squeue / scancel / sacct, in the text too
        assert f"  SLURM job {job} (RUNNING, submitted by epdctl)" in text.stdout.splitlines(), text.stdout

        assert jobs.cancel([job]) == []   # the allocation ends behind epdctl's back
        st = cli("status", name, "--json")
        assert st.returncode == 1 and "Traceback" not in st.stderr, st.stderr
        doc = json.loads(st.stdout)
        jsonschema.validate(doc, SCHEMA)
        assert doc["phase"] == "failed" and doc["allocation"]["state"] == "CANCELLED", doc
        assert doc["problem"].startswith(f"SLURM job {job} ended as CANCELLED"), doc["problem"]
        assert ("the first worker to end was prefill-0 (killed by signal 9 (SIGKILL))"
                in doc["problem"]), doc["problem"]
        assert not any(w["alive"] for w in doc["workers"])
        text = cli("status", name)
        assert text.returncode == 1
        assert text.stdout.splitlines()[0].startswith(f"cluster {name}  (failed, launcher slurm")
        assert f"SLURM job {job} ended as CANCELLED" in text.stdout.splitlines()[1]

        down = cli("down", name)
        assert down.returncode == 0, down.stdout + down.stderr
        assert cdir.load() is None and not (cdir.root / ALLOC_FILE).exists()
    finally:
        jobs.cancel([job])


def test_refused_up_cancels_the_queued_job_and_records_nothing(
        cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job may start only in an hour (pending, not hopeless): `up --timeout 5` gives up,
    cancels it, and leaves no record for `status` (with or without a name) to trip on."""
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path / "state"))
    src = ROOT / "topologies" / "slurm-local.yaml"
    doc = yaml.safe_load(src.read_text())
    doc["model"]["path"] = str((src.parent / doc["model"]["path"]).resolve())
    doc["slurm"]["extra"] = {"begin": "now+3600"}
    topology = tmp_path / "slurm-local.yaml"
    topology.write_text(yaml.safe_dump(doc, sort_keys=False))
    t0 = time.monotonic()
    up = cli("up", str(topology), "--timeout", "5", "--no-canary")
    assert time.monotonic() - t0 < 90
    out = up.stdout + up.stderr
    assert up.returncode == 1 and "Traceback" not in out, out
    assert "in the queue; it was cancelled. Raise --timeout" in out, out
    job = out.split("SLURM job ", 1)[1].split()[0]
    assert not jobs.poll([job])[job].active
    # the job id was printed as soon as sbatch answered, before the wait in the queue
    said = [ln for ln in up.stdout.splitlines() if ln.startswith(f"SLURM job {job} submitted: it holds the nodes")]
    assert len(said) == 1 and f"squeue -j {job}" in said[0], up.stdout
    cdir = ClusterDir(doc["name"])
    assert cdir.load() is None and not (cdir.root / ALLOC_FILE).exists()
    for args in (("status",), ("status", doc["name"])):
        st = cli(*args)
        assert st.returncode == 1 and "Traceback" not in st.stderr, st.stderr
        assert "no cluster" in st.stderr and "start one with `epdctl up" in st.stderr, st.stderr
