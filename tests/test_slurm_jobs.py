"""SLURM job control: parsers on recorded tool output, then the same paths on a real local cluster.

Bad input is reported clearly: more nodes or GPUs than the partition has, an unknown partition,
a cancelled job, an allocation that reached its time limit, and a worker (job step) that dies
at start or later, through `up`'s own BringUp and the slurm launcher.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from slurm_cluster import SlurmCluster, slurm_cluster

from epdctl.errors import LaunchError
from epdctl.launchers import get_launcher
from epdctl.orchestrate.lifecycle import BringUp
from epdctl.render import build_plan
from epdctl.launchers.slurm import jobs, steps
from epdctl.launchers.slurm.jobs import JobInfo
from epdctl.launchers.slurm.launcher import ALLOC_FILE, SlurmLauncher
from epdctl.state.store import ClusterDir, ClusterState, Handle, ProcessRecord
from epdctl.topology import load_topology

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
    err = jobs.ended(jobs.parse_squeue(SQUEUE)["6"])
    assert "SLURM job 6 ended as TIMEOUT" in err and "raise slurm.time" in err


# Recorded: `squeue --steps --noheader --jobs=13 --format='%i|%j'` on the local cluster.
SQUEUE_STEPS = "13.0|w1\n13.1|w0\n13.2|w2\n13.batch|batch\n13.3|w0\n"


def test_parse_steps_and_newest_step_per_name() -> None:
    parsed = steps.parse_steps(SQUEUE_STEPS)
    assert parsed == {"13.0": "w1", "13.1": "w0", "13.2": "w2", "13.batch": "batch", "13.3": "w0"}
    assert steps.by_name(parsed) == {"batch": "13.batch", "w1": "13.0", "w0": "13.3", "w2": "13.2"}
    argv = steps.srun_argv("13", "node2", "prefill-0", "/run/logs/prefill-0.log", "exec x")
    assert argv[:3] == ["srun", "--jobid=13", "--overlap"] and "--nodelist=node2" in argv
    assert argv[-3:] == ["bash", "-c", "exec x"]


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
    rec = ProcessRecord("w", "decode", "n0", log="/nonexistent/logs/w.log",
                        handle=Handle(job=job, step="0"))
    st = get_launcher("slurm").poll([rec]).ok["w"]
    assert st.alive is False and f"SLURM job {job} ended as CANCELLED" in st.tail
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


def _bring_up(topo, plan, name: str, timeout: float = 120):  # type: ignore[no-untyped-def]
    cdir = ClusterDir(name)
    state = ClusterState(name=name, topology="slurm-local.yaml", launcher="slurm")
    lau = SlurmLauncher(cdir.root, topo)
    return cdir, state, lau, BringUp(lau, cdir, state, timeout=timeout)


def test_worker_dying_at_start_fails_up_with_name_and_log(cluster: SlurmCluster, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path / "state"))
    server = ok_server("n0.slurm", 37100)
    dies = ("python3", "-c", "import sys; print('loading weights', flush=True); sys.exit('bad checkpoint')")
    topo, plan = _cheap_plan({"encoder": server, "prefill": dies})
    cdir, state, lau, up = _bring_up(topo, plan, "slurm-local-dies")
    with pytest.raises(LaunchError) as info:
        up.run(plan)
    msg = str(info.value)
    assert "[n1/prefill-0]" in msg and "during startup" in msg
    assert "bad checkpoint" in msg and "loading weights" in msg
    # the prefill's step can end inside the batched start (then it is a failed start, not one of
    # the started) or after it: what counts is that every process this run started was stopped
    assert f"stopped the {len(up.started)} process(es) this run had started" in msg
    assert 2 <= len(up.started) <= 3, [r.name for r in up.started]
    job = state.processes[0].handle.job  # type: ignore[union-attr]
    assert job and not jobs.poll([job])[job].active  # the allocation was given back
    assert cdir.load() is None and not (cdir.root / ALLOC_FILE).exists()


def test_allocation_reaching_its_time_limit_is_reported(cluster: SlurmCluster, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """slurm.time 1 (SLURM's smallest limit, one minute) with an encoder that never gets healthy."""
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path / "state"))
    topo, plan = _cheap_plan({"encoder": ("sleep", "600")})
    topo = dataclasses.replace(topo, slurm=dataclasses.replace(topo.slurm, time="1"))
    _cdir, _state, _lau, up = _bring_up(topo, plan, "slurm-local-timeout", timeout=600)
    with pytest.raises(LaunchError) as info:
        up.run(plan)
    msg = str(info.value)
    assert "ended as TIMEOUT" in msg and "raise slurm.time" in msg


def test_worker_dying_after_ready_is_dead_and_the_others_keep_running(
        cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path / "state"))
    topo, plan = _cheap_plan({"encoder": ok_server("n0.slurm", 37100), "prefill": ok_server("n1.slurm", 37200),
                              "decode": ok_server("n2.slurm", 37300)})
    # restart: never (the default, on-failure, restarts it: the next test). Before the supervisor's
    # ready pipe / 0.25 s probe, a kill right after `up` happened to land before its first probe.
    plan = dataclasses.replace(plan, restart={role: {"policy": "never"} for role in ("encoder", "prefill", "decode")})
    cdir, state, lau, up = _bring_up(topo, plan, "slurm-local-late-death")
    up.run(plan)
    try:
        assert all(s.alive for s in lau.poll(state.processes).ok.values())
        victims = [p for p in psutil.process_iter(["cmdline"])
                   if "37200" in (p.info["cmdline"] or []) and "-c" in (p.info["cmdline"] or [])
                   and "epdctl.node.supervise" not in (p.info["cmdline"] or [])]
        assert len(victims) == 1
        victims[0].kill()
        deadline = time.monotonic() + 60
        while lau.poll(state.processes).ok["prefill-0"].alive and time.monotonic() < deadline:
            time.sleep(0.2)
        polled = lau.poll(state.processes).ok
        assert not polled["prefill-0"].alive and polled["encoder-0"].alive and polled["decode-0"].alive
        assert "starting prefill-0 on node2" in polled["prefill-0"].tail
    finally:
        assert lau.stop(state.processes, grace=5).all_ok
        lau.release()


def test_up_timeout_bounds_the_wait_in_the_queue(cluster: SlurmCluster, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that may start only in an hour (``--begin``: pending, but not hopeless) is
    cancelled once `up --timeout` (the launcher's wait_limit) has passed, with a message."""
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path / "state"))
    topo, plan = _cheap_plan({})
    topo = dataclasses.replace(topo, slurm=dataclasses.replace(
        topo.slurm, extra={**topo.slurm.extra, "begin": "now+3600"}))
    _cdir, _state, lau, up = _bring_up(topo, plan, "slurm-local-queued")
    lau.wait_limit = 4
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as info:
        up.run(plan)
    assert time.monotonic() - t0 < 60
    msg = str(info.value)
    assert "in the queue; it was cancelled. Raise --timeout" in msg, msg
    job = msg.split("SLURM job ", 1)[1].split()[0]
    assert not jobs.poll([job])[job].active


def test_a_worker_killed_after_it_was_healthy_restarts_inside_its_step(
        cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The step's supervisor restarts the worker (restart: defaults, on-failure): the step,
    the allocation and the other steps live on; poll reports the restart and its cause."""
    import json

    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path / "state"))
    topo, plan = _cheap_plan({"encoder": ok_server("n0.slurm", 37100), "prefill": ok_server("n1.slurm", 37200),
                              "decode": ok_server("n2.slurm", 37300)})
    cdir, state, lau, up = _bring_up(topo, plan, "slurm-local-restart")
    up.run(plan)
    try:
        pid_file = cdir.root / "run" / "prefill-0.pid.json"
        deadline = time.monotonic() + 60
        while json.loads(pid_file.read_text())["state"] != "running" and time.monotonic() < deadline:
            time.sleep(0.2)
        before = json.loads(pid_file.read_text())
        step = state.find("prefill-0").handle.step  # type: ignore[union-attr]
        psutil.Process(before["child_pid"]).kill()
        while json.loads(pid_file.read_text())["restarts"] < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        polled = lau.poll(state.processes).ok
        assert polled["prefill-0"].alive and polled["prefill-0"].restarts == 1
        assert polled["prefill-0"].last_exit == "killed by signal 9 (SIGKILL)"
        assert state.find("prefill-0").handle.step == step  # type: ignore[union-attr]  # same step
        assert all(s.alive for s in polled.values())
    finally:
        assert lau.stop(state.processes, grace=5).all_ok
        lau.release()
