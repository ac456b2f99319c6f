"""SLURM job control: parsers on recorded tool output, then the same paths on a real local cluster.

Bad input is reported clearly: more nodes or GPUs than the partition has, an unknown partition,
a cancelled job, a job that reached its time limit, and a worker that dies inside the job.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Iterator

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from slurm_cluster import SlurmCluster, slurm_cluster  # noqa: E402

from epdctl.errors import LaunchError  # noqa: E402
from epdctl.launchers import get_launcher  # noqa: E402
from epdctl.launchers.base import Handle  # noqa: E402
from epdctl.launchers.lifecycle import to_handle  # noqa: E402
from epdctl.render import build_plan  # noqa: E402
from epdctl.slurm import jobs  # noqa: E402
from epdctl.slurm.jobs import JobInfo  # noqa: E402
from epdctl.slurm.launcher import _failure, slurm_up  # noqa: E402
from epdctl.state import ClusterDir, ClusterState  # noqa: E402
from epdctl.topology import load_topology  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# Recorded from Debian's slurm 22.05.8 (scripts/slurm_local.sh cluster).
SQUEUE = """\
1|CANCELLED|PartitionConfig||debug|UNLIMITED|0:00
4|RUNNING|None|node[1-3]|debug|30:00|1:37
5|PENDING|Priority||debug|30:00|0:00
6|TIMEOUT|TimeLimit|node1|debug|1:00|1:01
"""
SBATCH_BAD_PARTITION = ("sbatch: error: invalid partition specified: nope\n"
                        "sbatch: error: Batch job submission failed: Invalid partition name specified\n")
SBATCH_BAD_GRES = "sbatch: error: Invalid generic resource (gres) specification\n"
SBATCH_TOO_BIG = "allocation failure: Requested node configuration is not available\n"
SCONTROL_JOB = ("JobId=4 JobName=epd-slurm-local UserId=root(0) JobState=RUNNING Reason=None ExitCode=0:0 "
                "NodeList=node[1-3] BatchHost=node1 NumNodes=3 StdOut=/tmp/run/job-4.out")


def test_parse_job_id() -> None:
    assert jobs.parse_job_id("12\n") == "12"
    assert jobs.parse_job_id("13;cluster-a\n") == "13"
    with pytest.raises(LaunchError, match="could not read a job id"):
        jobs.parse_job_id("sbatch: error: something\n")


def test_parse_squeue_states_and_reasons() -> None:
    got = jobs.parse_squeue(SQUEUE)
    assert [got[j].state for j in ("1", "4", "5", "6")] == ["CANCELLED", "RUNNING", "PENDING", "TIMEOUT"]
    assert got["4"].nodes == "node[1-3]" and got["4"].active and got["5"].active
    assert not got["1"].active and not got["6"].active
    assert got["5"].hopeless is None  # waiting for priority may help
    pending_forever = dataclasses.replace(got["1"], state="PENDING")
    assert "more nodes/CPUs/GPUs than partition debug has" in (pending_forever.hopeless or "")
    assert jobs.parse_squeue("garbage\n\n") == {}


def test_parse_scontrol_record_and_hostnames() -> None:
    rec = jobs.parse_scontrol_record(SCONTROL_JOB)
    assert rec["JobState"] == "RUNNING" and rec["NodeList"] == "node[1-3]" and rec["ExitCode"] == "0:0"
    assert jobs.parse_hostnames("node1\nnode2\n\nnode3\n") == ["node1", "node2", "node3"]


def test_sbatch_errors_say_what_to_change() -> None:
    assert "unknown partition: set slurm.partition" in jobs.explain_sbatch_error(SBATCH_BAD_PARTITION)
    assert "slurm.gpus_per_node" in jobs.explain_sbatch_error(SBATCH_BAD_GRES)
    msg = jobs.explain_sbatch_error(SBATCH_TOO_BIG)
    assert "Requested node configuration is not available" in msg and "too many nodes" in msg


def test_timeout_failure_names_the_setting(tmp_path: Path) -> None:
    err = _failure("6", jobs.parse_squeue(SQUEUE)["6"], tmp_path)
    assert "SLURM job 6 ended as TIMEOUT" in str(err) and "raise slurm.time" in str(err)


# ----------------------------------------------------------------------------- real cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    yield from slurm_cluster()


@pytest.fixture()
def job_script(tmp_path: Path) -> Path:
    path = tmp_path / "sleep.sbatch"
    path.write_text("#!/bin/bash\n#SBATCH --output=/dev/null\nsrun sleep 600\n")
    return path


def test_unknown_partition_is_rejected_at_submit(cluster: SlurmCluster, job_script: Path) -> None:
    with pytest.raises(LaunchError, match="unknown partition: set slurm.partition"):
        jobs.submit(str(job_script), ["--partition=nope"])


def test_gpus_the_cluster_lacks_are_rejected_at_submit(cluster: SlurmCluster, job_script: Path) -> None:
    with pytest.raises(LaunchError, match="no such GPUs"):
        jobs.submit(str(job_script), ["--gpus-per-node=8"])


def test_more_nodes_than_the_partition_never_starts(cluster: SlurmCluster, job_script: Path) -> None:
    ok, msg = jobs.check_fits(str(job_script), ["--nodes=5"])
    assert not ok and "too many nodes" in msg
    job = jobs.submit(str(job_script), ["--nodes=5"])  # sbatch accepts it; it would pend forever
    try:
        info = jobs.poll([job])[job]
        assert info.state == "PENDING" and info.reason == "PartitionConfig"
        assert "more nodes/CPUs/GPUs than partition debug has" in (info.hopeless or "")
    finally:
        assert jobs.cancel([job]) == []


def test_cancelled_job_is_reported_and_nothing_remains(cluster: SlurmCluster, job_script: Path) -> None:
    job = jobs.submit(str(job_script), ["--nodes=2"])
    assert cluster.wait_state(job, ("RUNNING",)) == "RUNNING"
    assert jobs.cancel([job]) == []
    assert jobs.poll([job])[job].state == "CANCELLED"
    handle = Handle(name="w", role="decode", node="n0", pid=int(job), pgid=int(job), create_time=0.0,
                    log=Path("/nonexistent/logs/w.log"), since=0.0, argv=())
    assert get_launcher("slurm").is_alive(handle) is False
    assert jobs.poll(["999999"])["999999"].state == "GONE"


def _cheap_plan(argv_by_role: dict[str, tuple[str, ...]]):  # type: ignore[no-untyped-def]
    """slurm-local's plan with the workers replaced by instant commands (no torch)."""
    topo = load_topology(ROOT / "topologies" / "slurm-local.yaml")
    plan = build_plan(topo)
    workers = [dataclasses.replace(w, argv=argv_by_role.get(w.role, w.argv)) for w in plan.workers]
    return topo, dataclasses.replace(plan, workers=workers, router=None)


OK_SERVER = ("import sys, http.server as h\n"
             "class H(h.BaseHTTPRequestHandler):\n"
             "    def do_GET(self):\n"
             "        self.send_response(200); self.end_headers()\n"
             "h.HTTPServer((sys.argv[1], int(sys.argv[2])), H).serve_forever()\n")


def ok_server(host: str, port: int) -> tuple[str, ...]:
    """A stand-in worker answering 200 on every path; ``host`` is a topology address (n0.slurm),
    which the script replaces with the allocated node's."""
    return ("python3", "-c", OK_SERVER, host, str(port))


def test_worker_dying_inside_the_job_fails_it_with_name_and_log(cluster: SlurmCluster, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path / "state"))
    server = ok_server("n0.slurm", 37100)
    dies = ("python3", "-c", "import sys; print('loading weights', flush=True); sys.exit('bad checkpoint')")
    topo, plan = _cheap_plan({"encoder": server, "prefill": dies})
    cdir = ClusterDir("slurm-local-dies")
    state = ClusterState(name=cdir.name, topology="slurm-local.yaml", launcher="slurm")
    with pytest.raises(LaunchError) as info:
        slurm_up(topo, plan, cdir, state, timeout=120)
    msg = str(info.value)
    assert "prefill-0 died (exit status 1)" in msg
    assert "bad checkpoint" in msg and "loading weights" in msg
    job = str(ClusterDir("slurm-local-dies").load().processes[0].pid)  # type: ignore[union-attr]
    assert not jobs.poll([job])[job].active


def test_job_reaching_its_time_limit_is_reported(cluster: SlurmCluster, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`--time=1` (SLURM's smallest limit, one minute) with an encoder that never gets healthy."""
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path / "state"))
    topo, plan = _cheap_plan({"encoder": ("sleep", "600")})
    cdir = ClusterDir("slurm-local-timeout")
    state = ClusterState(name=cdir.name, topology="slurm-local.yaml", launcher="slurm")
    with pytest.raises(LaunchError) as info:
        slurm_up(topo, plan, cdir, state, timeout=600, sbatch_args=["--time=1"])
    msg = str(info.value)
    assert "ended as TIMEOUT" in msg and "raise slurm.time" in msg


def test_worker_dying_after_ready_fails_the_job(cluster: SlurmCluster, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path / "state"))
    topo, plan = _cheap_plan({"encoder": ok_server("n0.slurm", 37100), "prefill": ok_server("n1.slurm", 37200),
                              "decode": ok_server("n2.slurm", 37300)})
    cdir = ClusterDir("slurm-local-late-death")
    state = ClusterState(name=cdir.name, topology="slurm-local.yaml", launcher="slurm")
    slurm_up(topo, plan, cdir, state, timeout=120)
    job = str(state.processes[0].pid)
    launcher = get_launcher("slurm")
    try:
        assert all(launcher.is_alive(to_handle(p)) for p in state.processes)
        victims = [p for p in psutil.process_iter(["cmdline"])
                   if "37200" in (p.info["cmdline"] or []) and "-c" in (p.info["cmdline"] or [])]
        assert len(victims) == 1
        victims[0].kill()
        deadline = time.monotonic() + 60
        while jobs.poll([job])[job].active and time.monotonic() < deadline:
            time.sleep(0.2)
        info = jobs.poll([job])[job]
        assert info.state == "FAILED"
        assert not launcher.is_alive(to_handle(state.processes[0]))
        out = (cdir.root / f"job-{job}.out").read_text()
        assert "worker prefill-0 died" in out and "starting prefill-0 on node2" in out
        assert "worker prefill-0 died" in str(_failure(job, info, cdir.root))
    finally:
        assert jobs.cancel([job]) == []
