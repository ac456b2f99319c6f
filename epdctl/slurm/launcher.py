"""The slurm launcher: the whole cluster is ONE batch job; epdctl submits it and follows it.

`up` renders the sbatch script into the cluster's run folder (which doubles as the job's
``$EPD_RUN_DIR``: it must be on a filesystem the nodes share, as SLURM clusters have), submits
it, reports pending reasons, follows the script's ``phase`` file to ``ready`` and records every
worker (pid = job id) in the cluster state, so `status`, `logs` and `down` work like for the
other launchers: a worker is alive while the job runs and the script has not seen it die;
`down` is ``scancel`` plus confirmation that the job is gone.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from epdctl.errors import LaunchError
from epdctl.launchers.base import Handle, LaunchSpec, Results, tail
from epdctl.launchers.lifecycle import Event
from epdctl.routerctl import RouterClient
from epdctl.slurm import jobs
from epdctl.slurm.jobs import JobInfo
from epdctl.slurm.sbatch import render_sbatch, slurm_nodes, steps
from epdctl.state import ClusterDir, ClusterState, ProcessRecord

log = logging.getLogger(__name__)
RUN_FILES = ("phase", "nodes", "workers", "dead")


def read_phase(run_dir: Path) -> str:
    try:
        return (run_dir / "phase").read_text().strip()
    except FileNotFoundError:
        return ""


def read_nodes(run_dir: Path) -> dict[str, tuple[str, str]]:
    """The script's node map: topology node -> (SLURM node name, address)."""
    out: dict[str, tuple[str, str]] = {}
    try:
        for line in (run_dir / "nodes").read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                out[parts[0]] = (parts[1], parts[2])
    except FileNotFoundError:
        pass
    return out


def read_dead(run_dir: Path) -> set[str]:
    try:
        return set((run_dir / "dead").read_text().split())
    except FileNotFoundError:
        return set()


def resolve_url(url: str, addrs: list[str]) -> str:
    for i, addr in enumerate(addrs):
        url = url.replace("${EPD_ADDR_%d}" % i, addr)
    return url


class SlurmLauncher:
    """Launcher protocol over one SLURM job per cluster (handle.pid is the job id)."""

    name = "slurm"

    def __init__(self, topology: Any = None, cluster_dir: Path | None = None, cache_s: float = 1.0):
        self.topology = topology
        self.cluster_dir = cluster_dir
        self.cache_s = cache_s
        self._lock = threading.Lock()
        self._cache: tuple[float, dict[str, JobInfo]] = (0.0, {})

    def start(self, spec: LaunchSpec, log: Path) -> Handle:
        raise LaunchError(f"[{spec.name}] the slurm launcher starts a whole cluster as one job; "
                          f"use `epdctl up TOPOLOGY --launcher slurm`")

    def jobs(self, job_ids: Iterable[str]) -> dict[str, JobInfo]:
        """One squeue for all ids, shared by the threads of one `status` for ``cache_s``."""
        ids = set(job_ids)
        with self._lock:
            at, cached = self._cache
            if time.monotonic() - at > self.cache_s or not ids <= set(cached):
                cached = jobs.poll(ids | set(cached))
                self._cache = (time.monotonic(), cached)
            return {j: cached[j] for j in ids}

    def is_alive(self, handle: Handle) -> bool:
        job = str(handle.pid)
        if self.jobs([job])[job].state != "RUNNING":
            return False
        return handle.name not in read_dead(handle.log.parent.parent)

    def exit_code(self, handle: Handle) -> str | None:
        return jobs.job_record(str(handle.pid)).get("ExitCode")

    def stop(self, handles: Iterable[Handle], grace: float = 10.0) -> Results[None]:
        """scancel every job and wait until the scheduler no longer runs any of them."""
        hs = list(handles)
        res: Results[None] = Results()
        ids = {str(h.pid) for h in hs}
        try:
            left = set(jobs.cancel(ids, timeout=grace + 60))
        except LaunchError as e:
            for h in hs:
                res.failed[h.name] = e
            return res
        with self._lock:
            self._cache = (0.0, {})
        for h in hs:
            if str(h.pid) in left:
                res.failed[h.name] = LaunchError(f"job {h.pid} still active after scancel; "
                                                 f"check `squeue -j {h.pid}`")
            else:
                res.ok[h.name] = None
        return res


def _records(topo: Any, plan: Any, job: str, run_dir: Path, addrs: list[str]) -> list[ProcessRecord]:
    out = []
    now = time.time()
    by_name = {w.name: w for w in plan.workers}
    for _stage, group in steps(topo, plan):
        for s in group:
            spec = by_name.get(s.name, plan.router)
            url = resolve_url(s.url, addrs)
            host = url.split("//", 1)[1].rsplit(":", 1)[0].strip("[]")
            out.append(ProcessRecord(
                name=s.name, role=s.role, node=s.node, host=host, port=int(spec.port), url=url, pid=int(job),
                pgid=int(job), create_time=0.0, log=str(run_dir / "logs" / f"{s.name}.log"), since=now,
                argv=list(spec.argv), health_path=spec.health_path,
                bootstrap_port=getattr(spec, "bootstrap_port", None), is_leader=s.is_leader))
    return out


def _failure(job: str, info: JobInfo, run_dir: Path) -> LaunchError:
    """Why the job is not running: the script's phase, the dead worker's log, the job output."""
    phase = read_phase(run_dir)
    dead = sorted(read_dead(run_dir))
    head = [f"SLURM job {job} ended as {info.state}" + (f" ({info.reason})" if info.reason not in ("", "None")
                                                         else "")]
    if info.state == "TIMEOUT":
        head.append("it reached its time limit: raise slurm.time in the topology")
    if phase.startswith("failed"):
        head.append(phase.removeprefix("failed ").strip())
    tails = []
    for name in dead:
        path = run_dir / "logs" / f"{name}.log"
        tails.append(f"last lines of {path}:\n{tail(path, 20)}")
    out = run_dir / f"job-{job}.out"
    if not dead and out.exists():
        tails.append(f"last lines of {out}:\n{tail(out, 20)}")
    return LaunchError("; ".join(head) + "".join("\n" + t for t in tails))


def submit_cluster(topo: Any, plan: Any, cdir: ClusterDir, *, ready_timeout: float,
                   template: Path | None = None, sbatch_args: Iterable[str] = ()) -> str:
    """Write job.sbatch into the run folder and submit it; returns the job id."""
    run_dir = cdir.root
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    for f in RUN_FILES:
        (run_dir / f).unlink(missing_ok=True)
    for old in (run_dir / "logs").glob("*.log"):
        old.unlink()
    script = run_dir / "job.sbatch"
    script.write_text(render_sbatch(topo, plan, template, output=str(run_dir / "job-%j.out"),
                                    ready_timeout=int(ready_timeout)))
    env = dict(os.environ, EPD_RUN_DIR=str(run_dir))
    if not plan.setup:  # no venv activation on the nodes: run the interpreter epdctl runs under
        env.setdefault("EPDCTL_PYTHON", sys.executable)
    return jobs.submit(str(script), ["--chdir", str(run_dir), *sbatch_args], env=env)


def follow(job: str, cdir: ClusterDir, *, timeout: float, on_event: Callable[[Event], None],
           interval: float = 0.3) -> None:
    """Poll until the script reports ``ready``; LaunchError (job cancelled) on any failure."""
    run_dir = cdir.root
    t0 = time.monotonic()
    started: float | None = None
    last = ""
    while True:
        info = jobs.poll([job])[job]
        if info.state == "PENDING":
            why = info.hopeless
            if why:
                jobs.cancel([job])
                raise LaunchError(f"SLURM job {job} can never start: {why} (squeue reason {info.reason}); "
                                  f"cancelled it. Compare the topology with `sinfo -N -l`")
            note = f"pending ({info.reason})"
        elif info.state == "RUNNING":
            started = started or time.monotonic()
            phase = read_phase(run_dir)
            if phase == "ready":
                on_event(Event("job", "ready", 1, 1, time.monotonic() - t0, f"job {job} on {info.nodes}"))
                return
            if phase.startswith("failed"):
                jobs.cancel([job])
                raise _failure(job, jobs.poll([job])[job], run_dir)
            note = f"running on {info.nodes}: {phase or 'starting'}"
            if time.monotonic() - started > timeout:
                jobs.cancel([job])
                raise LaunchError(f"SLURM job {job} not ready after {timeout:.0f}s ({phase or 'starting'}); "
                                  f"cancelled it. Raise --timeout if the model is still loading; logs in "
                                  f"{run_dir / 'logs'}")
        elif not info.active:
            raise _failure(job, info, run_dir)
        else:
            note = info.state.lower()
        if note != last:
            on_event(Event("job", "waiting", 0, 1, time.monotonic() - t0, f"job {job} {note}"))
            last = note
        time.sleep(interval)


def slurm_up(topo: Any, plan: Any, cdir: ClusterDir, state: ClusterState, *, timeout: float = 1800.0,
             on_event: Callable[[Event], None] | None = None, template: Path | None = None,
             sbatch_args: Iterable[str] = ()) -> ClusterState:
    """Submit, follow to ready, record the workers; the job is cancelled on any failure."""
    emit = on_event or (lambda e: None)
    job = submit_cluster(topo, plan, cdir, ready_timeout=timeout, template=template, sbatch_args=sbatch_args)
    emit(Event("job", "starting", 0, 1, 0.0, f"submitted SLURM job {job}"))
    state.processes = _records(topo, plan, job, cdir.root, [])
    cdir.save(state)  # recorded at once: `down` can cancel it even if this process dies now
    try:
        follow(job, cdir, timeout=timeout, on_event=emit)
        names = read_nodes(cdir.root)
        missing = [n for n in slurm_nodes(topo, plan) if n not in names]
        if missing:
            raise LaunchError(f"job {job} is ready but {cdir.root / 'nodes'} lacks node(s) {', '.join(missing)}")
        addrs = [names[n][1] for n in slurm_nodes(topo, plan)]
        state.processes = _records(topo, plan, job, cdir.root, addrs)
        cdir.save(state)
        if state.router is not None:
            _wait_router(job, state, cdir, timeout, emit)
    except BaseException:
        jobs.cancel([job])
        raise
    state.phase = "running"
    cdir.save(state)
    return state


def _wait_router(job: str, state: ClusterState, cdir: ClusterDir, timeout: float,
                 emit: Callable[[Event], None]) -> None:
    rec = state.router
    assert rec is not None
    client = RouterClient(rec.url, state.api_key_env)
    t0 = time.monotonic()
    while True:
        ok, doc = client.readiness()
        if ok:
            emit(Event("router", "ready", 1, 1, time.monotonic() - t0))
            return
        info = jobs.poll([job])[job]
        if info.state != "RUNNING" or read_phase(cdir.root).startswith("failed"):
            raise _failure(job, info, cdir.root)
        if time.monotonic() - t0 > timeout:
            raise LaunchError(f"[{rec.node}/router] not ready after {timeout:.0f}s ({doc}); "
                              f"see `epdctl logs router`")
        time.sleep(0.5)
