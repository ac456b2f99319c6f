"""End to end on a real local SLURM cluster: topologies/slurm-local.yaml (embedded engine, 3 nodes)
started by `epdctl up` from INSIDE an existing allocation (`salloc --no-shell`, SLURM_JOB_ID
exported, as in an interactive allocation): every worker is a job step of that allocation, a
real answer comes through the smg router, then `epdctl status`, `logs` and `down` through the
CLI; `down` stops the steps and leaves the allocation to its owner; no worker process is left.
(`up` from a login node, submitting its own allocation, is tests/e2e/test_rebalance_launchers.py.)

The fake SLURM nodes share this host, so the topology gives each node its own port range
(37100+, 37200+, 37300+) and the sbatch script binds every worker to its node's NodeAddr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from slurm_cluster import SlurmCluster, slurm_cluster

from epdctl.http.probes import http
from epdctl.launchers.slurm import jobs, steps
from epdctl.state.store import ClusterDir
from epdctl.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "topologies" / "slurm-local.yaml"
PORTS = ("37100", "37101", "37102", "37200", "37201", "37202", "37300")


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    yield from slurm_cluster()


def _ours() -> list[psutil.Process]:
    """Worker or router processes of this topology (found by their planned ports)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if ("epdctl.runtime" in cmd or "smg" in cmd) and any(f"--port {port}" in cmd for port in PORTS):
            out.append(p)
    return out


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epdctl", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def _salloc(cluster: SlurmCluster, nodes: int) -> str:
    """An allocation with no shell (what `salloc` gives an interactive user), its job id."""
    out = cluster.run("salloc", "--no-shell", f"--nodes={nodes}", "--time=00:30:00", timeout=120)
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stderr.splitlines() if "Granted job allocation" in ln)
    return line.rsplit(" ", 1)[1]


def test_up_inside_an_allocation_answer_status_down(cluster: SlurmCluster, tmp_path: Path) -> None:
    job = _salloc(cluster, 3)
    env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp_path / "state"), SLURM_JOB_ID=job)
    topo = load_topology(TOPOLOGY)
    cdir = ClusterDir(topo.name, tmp_path / "state")
    try:
        up = _cli("up", str(TOPOLOGY), "--no-canary", "--timeout", "600", env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"running inside SLURM allocation {job} ($SLURM_JOB_ID)" in up.stdout, up.stdout
        assert f"  SLURM job: {job}  (squeue -j {job}; sacct -j {job})" in up.stdout.splitlines(), up.stdout
        rec = cdir.load()
        assert rec is not None and rec.phase == "running" and rec.launcher == "slurm"
        assert {p.handle.job for p in rec.processes if p.handle} == {job}
        live = steps.by_name(steps.list_steps(job))
        assert {p.name: p.handle.step_id for p in rec.processes if p.handle} == {
            n: live[n] for n in ("encoder-0", "prefill-0", "decode-0", "router")}
        assert {p.node for p in rec.processes} == {"n0", "n1", "n2"}

        router = rec.router
        assert router is not None and router.url == "http://127.0.0.1:37101"
        reply = http("POST", f"{router.url}/v1/chat/completions", timeout=120, body={
            "model": "tiny-qwen2vl", "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "hello"}]})
        assert reply.status == 200, reply.error or reply.body[:500]
        body = json.loads(reply.body)
        assert body["choices"][0]["message"]["content"].strip()
        assert body["usage"]["completion_tokens"] > 0

        st = _cli("status", topo.name, "--json", env=env)
        assert st.returncode == 0, st.stdout + st.stderr
        view = json.loads(st.stdout)
        assert view["launcher"] == "slurm" and view["healthy"] is True
        assert {w["name"] for w in view["workers"]} == {"encoder-0", "prefill-0", "decode-0", "router"}
        assert view["allocation"] == {"job": job, "state": "RUNNING", "detail": "", "owned": False}
        text = _cli("status", topo.name, env=env)
        assert f"  SLURM job {job} (RUNNING, adopted: its owner ends it)" in text.stdout.splitlines(), text.stdout

        lg = _cli("logs", "prefill-0", "-c", topo.name, "-n", "200", env=env)
        assert lg.returncode == 0 and "epdctl: starting prefill-0 on node2" in lg.stdout

        down = _cli("down", topo.name, env=env)
        assert down.returncode == 0, down.stdout + down.stderr
        assert cdir.load() is None
        assert jobs.poll([job])[job].state == "RUNNING"  # not ours to cancel
        assert set(steps.list_steps(job).values()) <= {"batch", "extern"}  # every step gone
    finally:
        jobs.cancel([job])
    deadline = time.monotonic() + 60  # slurmstepd reaps the tasks after the steps ended
    while _ours() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _ours() == []
