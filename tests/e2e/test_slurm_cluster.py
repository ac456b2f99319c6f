"""End to end on a real local SLURM cluster: topologies/slurm-local.yaml (embedded engine, 3 nodes)
as one batch job, a real answer through the smg router, then `epdctl status`, `logs` and `down`
through the CLI, and no worker process left.

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_cluster import SlurmCluster, slurm_cluster  # noqa: E402

from epdctl.probes import http  # noqa: E402
from epdctl.render import build_plan  # noqa: E402
from epdctl.slurm import jobs  # noqa: E402
from epdctl.slurm.launcher import read_nodes, slurm_up  # noqa: E402
from epdctl.state import ClusterDir, ClusterState  # noqa: E402
from epdctl.topology import load_topology  # noqa: E402

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


def test_slurm_cluster_up_answer_status_down(cluster: SlurmCluster, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    state_dir = tmp_path / "state"
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(state_dir))
    env = dict(os.environ)
    topo = load_topology(TOPOLOGY)
    plan = build_plan(topo)
    cdir = ClusterDir(topo.name)
    state = ClusterState(name=topo.name, topology=str(TOPOLOGY), launcher="slurm", model=topo.model.served_name)
    events: list[str] = []
    try:
        slurm_up(topo, plan, cdir, state, timeout=600, on_event=lambda e: events.append(f"{e.stage} {e.kind}"))
        assert "job ready" in events and "router ready" in events
        rec = cdir.load()
        assert rec is not None and rec.phase == "running"
        job = str(rec.processes[0].pid)
        info = jobs.poll([job])[job]
        assert info.state == "RUNNING"
        # the allocation's first three nodes, in order, carry the topology's n0, n1, n2
        assert [v[0] for _, v in sorted(read_nodes(cdir.root).items())] == ["node1", "node2", "node3"]
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

        lg = _cli("logs", "prefill-0", "-c", topo.name, "-n", "200", env=env)
        assert lg.returncode == 0 and "epdctl: starting prefill-0 on node2" in lg.stdout

        down = _cli("down", topo.name, env=env)
        assert down.returncode == 0, down.stdout + down.stderr
        assert not jobs.poll([job])[job].active
        assert cdir.load() is None
    finally:
        left = [p.pid for p in cdir.load().processes] if cdir.load() else []  # type: ignore[union-attr]
        if left:
            jobs.cancel([str(left[0])])
    deadline = time.monotonic() + 60  # slurmstepd reaps the tasks after the job has ended
    while _ours() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _ours() == []
