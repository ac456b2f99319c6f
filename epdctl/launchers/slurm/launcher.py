"""The slurm launcher: one allocation per cluster, one job step per worker.

`up` gets an allocation (submits a holder batch job that only keeps the nodes until `down`, or,
run inside `salloc`/a batch job, adopts ``$SLURM_JOB_ID``), maps the topology's nodes onto the
allocated ones in order, and starts every worker as its own step: ``srun --jobid J --overlap
--nodelist NODE ...``. A step is stopped with ``scancel J.STEP`` and a new one started in the
same allocation, so `rebalance` works as on the other launchers. Polling is one ``squeue
--steps`` for all workers. `down` stops the steps, then cancels the allocation if epdctl
submitted it (an adopted one is left to its owner).

The run folder (``clusters/<name>``) must be on a filesystem the nodes share, as SLURM clusters
have: the steps write their logs there.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from epdctl.errors import LaunchError
from epdctl.launchers.base import (SUPERVISOR, Holding, Results, Status, cluster_id, expand_argv,
                                   follow_file, new_token, read_pid_file, supervision_env, tail,
                                   worker_env)
from epdctl.launchers.slurm import allocation, jobs, steps
from epdctl.launchers.streams import ProcessJobs
from epdctl.launchers.slurm.allocation import ALLOC_FILE, Allocation, holder_script
from epdctl.launchers.slurm.sbatch import step_command, substitute
from epdctl.state.store import Handle, ProcessRecord

log = logging.getLogger(__name__)
__all__ = ["ALLOC_FILE", "Allocation", "SlurmLauncher", "holder_script"]


class SlurmLauncher:
    """Launcher contract over job steps inside one allocation (handle: job, step, srun pid)."""

    name = "slurm"
    runs_here = False
    nodes_known = False   # the allocation chooses them when the job starts

    def __init__(self, cluster_dir: Path | None = None, topology: Any = None,
                 accept_new_host_keys: bool = False):
        self.cluster_dir = cluster_dir
        self.topology = topology
        self._alloc: Allocation | None = None
        self._srun: dict[str, subprocess.Popen[bytes]] = {}
        self._tokens: dict[str, str] = {}

    # ---- allocation ----------------------------------------------------------------------

    @property
    def _alloc_file(self) -> Path:
        if self.cluster_dir is None:
            raise LaunchError("the slurm launcher needs the cluster's run folder")
        return self.cluster_dir / ALLOC_FILE

    wait_limit = 600.0   # seconds a submitted job may wait in the queue (`up --timeout` sets it)
    announce: allocation.Announce | None = None   # `up`: told the job id as soon as it is known

    def allocation(self, timeout: float | None = None) -> Allocation:
        """The cluster's allocation: recorded, adopted from $SLURM_JOB_ID, or submitted now
        (waiting at most ``timeout``, default ``wait_limit`` seconds, for it to run)."""
        if self._alloc is not None:
            return self._alloc
        rec = allocation.recorded(self._alloc_file.parent)
        if rec is not None:
            if self.topology is None or jobs.poll([rec.job])[rec.job].state == "RUNNING":
                self._alloc = rec
                if self.topology is not None and self.announce is not None:
                    self.announce(rec.job, rec.owned)
                return rec
            self._alloc_file.unlink()  # an allocation that ended since: get a new one
        if self.topology is None:
            raise LaunchError(f"no SLURM allocation is recorded in {self._alloc_file}")
        self._alloc = allocation.obtain(self._alloc_file.parent, self.topology,
                                        self.wait_limit if timeout is None else timeout,
                                        self.announce)
        return self._alloc

    def holding(self, recs: Sequence[ProcessRecord]) -> Holding | None:
        """The allocation's state; when it ended, why, and which worker ended first."""
        if self.cluster_dir is None:
            return None
        alloc = allocation.recorded(self.cluster_dir)
        if alloc is None:
            return None
        first = []
        for r in recs:
            path = self.pid_file(r)
            try:
                doc = json.loads(path.read_text())
                if doc.get("token") == (r.handle.token if r.handle else None) \
                        and doc.get("state") == "exited":
                    first.append((path.stat().st_mtime, r.name, str(doc.get("last_exit"))))
            except (OSError, ValueError, AttributeError):
                continue
        return allocation.holding(alloc, [(n, why) for _, n, why in sorted(first)])

    def node_runners(self, nodes: Sequence[str]) -> Mapping[str, Any]:
        """`check` reaches the topology's nodes over SSH, as the ssh launcher would."""
        from epdctl.launchers.ssh import SSHLauncher

        return SSHLauncher(None, self.topology).node_runners(nodes)

    def node_jobs(self, nodes: Sequence[str]) -> Mapping[str, Any]:
        """Programs run to completion on the allocated nodes behind ``nodes``, each as its own
        step inside the allocation (obtained now when there is none)."""
        alloc = self.allocation()
        topo = self.topology
        out = {}
        for n in nodes:
            slurm_name = alloc.nodes[n][0]
            prefix = ("srun", f"--jobid={alloc.job}", "--overlap", "--nodes=1", "--ntasks=1",
                      f"--nodelist={slurm_name}", f"--job-name=epdctl-job-{n}", "--kill-on-bad-exit=1")
            python = alloc.python.get(n) or (topo.python if topo is not None else "python3")
            setup = tuple(topo.node(n).setup) if topo is not None and not alloc.python.get(n) else ()
            out[n] = ProcessJobs(n, python, prefix, setup)
        return out

    def place(self, text: str) -> str:
        """A topology address (in a URL, a flag) -> the allocated node's address."""
        return substitute(text, self.allocation().hosts)

    # ---- contract ------------------------------------------------------------------------

    def start(self, recs: Sequence[ProcessRecord]) -> Results[Handle]:
        """One ``srun --overlap`` per worker, then one ``squeue --steps`` loop to learn the
        step ids. The records come placed (``Plan.placed``: the allocated nodes' addresses)."""
        res: Results[Handle] = Results()
        try:
            alloc = self.allocation()
        except LaunchError as e:
            return Results(failed={r.name: e for r in recs})
        for rec in recs:
            try:
                self._launch(alloc, rec)
            except LaunchError as e:
                res.failed[rec.name] = e
        pending = {r.name: r for r in recs if r.name in self._srun}
        deadline = time.monotonic() + 60
        while pending:
            found = steps.by_name(steps.list_steps(alloc.job))
            for name, rec in list(pending.items()):
                proc = self._srun[name]
                if name in found:
                    res.ok[name] = Handle(pid=proc.pid, pgid=proc.pid, create_time=time.time(),
                                          host=alloc.nodes[rec.node][1], job=alloc.job,
                                          step=found[name].split(".", 1)[1],
                                          token=self._tokens.get(name))
                    del pending[name]
                elif proc.poll() is not None:
                    res.failed[name] = LaunchError(
                        f"[{rec.node}/{name}] died during startup (srun exited with status "
                        f"{proc.returncode}); last lines of {rec.log}:\n{tail(Path(rec.log), 20)}")
                    del pending[name]
            if pending and time.monotonic() > deadline:
                for name, rec in pending.items():
                    self._srun[name].kill()
                    res.failed[name] = LaunchError(f"[{rec.node}/{name}] no job step appeared "
                                                   f"in job {alloc.job} within 60s")
                break
            if pending:
                time.sleep(0.2)
        return res

    def _launch(self, alloc: Allocation, rec: ProcessRecord) -> None:
        if rec.node not in alloc.nodes:
            raise LaunchError(f"[{rec.node}/{rec.name}] node {rec.node} is not part of "
                              f"allocation {alloc.job} ({', '.join(alloc.nodes)})")
        # the record is placed already (Plan.placed: its addresses are the allocated nodes')
        plan_python = str(getattr(self.topology, "python", "python3"))
        python = alloc.python.get(rec.node) or None  # this interpreter, where the node has no setup
        # a container step runs the plan's command as it is, in the image (no host supervisor inside)
        boxed = bool(rec.step_options)
        command = step_command(expand_argv(list(rec.argv), rec.name), rec.setup, plan_python=plan_python,
                               python=None if boxed else python,
                               prefix=[] if boxed else [python or plan_python, *SUPERVISOR])
        env = worker_env(rec.env, rec.name, keys=rec.key_vars)
        rec_token = new_token()
        self._tokens[rec.name] = rec_token
        assert self.cluster_dir is not None
        env.update(supervision_env(cluster_id(self.cluster_dir), rec, rec_token, str(self.pid_file(rec))))
        logf = Path(rec.log)
        logf.parent.mkdir(parents=True, exist_ok=True)
        slurm_node = alloc.nodes[rec.node][0]
        with open(logf, "ab") as out:
            out.write(f"=== epdctl: starting {rec.name} on {slurm_node} at "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')} ===\n".encode())
            out.flush()
            try:
                self._srun[rec.name] = subprocess.Popen(
                    steps.srun_argv(alloc.job, slurm_node, rec.name, str(logf), command,
                                    rec.step_options),
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                    start_new_session=True, close_fds=True)
            except OSError as e:
                raise LaunchError(f"[{rec.node}/{rec.name}] cannot run srun: {e}") from e

    def poll(self, recs: Sequence[ProcessRecord]) -> Results[Status]:
        res: Results[Status] = Results()
        by_job: dict[str, set[str]] = {}
        gone: dict[str, str] = {}   # job -> why it no longer runs
        try:
            for job in {r.handle.job for r in recs if r.handle and r.handle.job}:
                by_job[job] = set(steps.list_steps(job))
                wanted = {r.handle.step_id for r in recs if r.handle and r.handle.job == job and r.handle.step_id}
                if not by_job[job] or wanted - by_job[job]:
                    # a step is gone: when the allocation itself ended (time limit, node failure,
                    # scancel), that is the cause to report, not the step's own last lines
                    why = allocation.job_end(job)
                    if why:
                        gone[job] = why
        except LaunchError as e:
            return Results(failed={r.name: e for r in recs})
        for r in recs:
            h = r.handle
            if h is None or not h.job:
                res.ok[r.name] = Status(False)
            elif h.step is None:  # a v1 state: the whole cluster was one batch job
                res.ok[r.name] = Status(jobs.poll([h.job])[h.job].state == "RUNNING")
            else:
                n, last = read_pid_file(self.pid_file(r), h.token) if self.cluster_dir else (0, None)
                if h.step_id in by_job[h.job]:
                    res.ok[r.name] = Status(True, None, "", n, last)
                else:
                    note = f"\n{gone[h.job]}" if h.job in gone else ""
                    res.ok[r.name] = Status(False, None, tail(Path(r.log), 20) + note, n, last)
        return res

    def pid_file(self, rec: ProcessRecord) -> Path:
        """The supervisor's pid file, in the run folder the nodes share."""
        assert self.cluster_dir is not None
        return self.cluster_dir / "run" / f"{rec.name}.pid.json"

    def orphans(self) -> list[ProcessRecord]:
        """The worker steps of the cluster's recorded allocation (its batch/extern steps and
        the holder excluded): found without state.json, never outside that job."""
        if self.cluster_dir is None or not self._alloc_file.exists():
            return []
        job = self.allocation().job
        out = []
        for sid, name in steps.list_steps(job).items():
            step = sid.split(".", 1)[1]
            if step.isdigit() and name not in ("batch", "extern"):
                out.append(ProcessRecord(name=name, role="unknown", node="?",
                                         log=str(self.cluster_dir / "logs" / f"{name}.log"),
                                         handle=Handle(job=job, step=step)))
        return out

    def stop(self, recs: Sequence[ProcessRecord], grace: float = 10.0) -> Results[None]:
        """SIGTERM every step at once (``scancel --signal=TERM``), cancel what is left after
        ``grace``, and confirm ``squeue --steps`` no longer lists them."""
        res: Results[None] = Results()
        ids = {r.name: r.handle.step_id for r in recs if r.handle and r.handle.step_id}
        legacy = {r.handle.job for r in recs if r.handle and r.handle.job and r.handle.step is None}
        try:
            left = steps.cancel_steps(sorted(set(ids.values())), grace=grace)
            if legacy:
                left += jobs.cancel(sorted(legacy), timeout=grace + 60)
        except LaunchError as e:
            return Results(failed={r.name: e for r in recs})
        for r in recs:
            sid = ids.get(r.name)
            if sid is not None and sid in left:
                res.failed[r.name] = LaunchError(f"[{r.node}/{r.name}] step {sid} still runs "
                                                 f"after scancel; check `squeue --steps`")
            else:
                res.ok[r.name] = None
        return res

    def logs(self, rec: ProcessRecord, lines: int = 40) -> str:
        return tail(Path(rec.log), lines)

    def follow(self, rec: ProcessRecord) -> Iterator[str]:
        return follow_file(Path(rec.log))

    def release(self) -> None:
        """Cancel the allocation if epdctl submitted it; forget it either way."""
        if self.cluster_dir is None or not self._alloc_file.exists():
            return
        alloc = self.allocation()
        if alloc.owned:
            left = jobs.cancel([alloc.job], timeout=90)
            if left:
                raise LaunchError(f"SLURM job {alloc.job} is still active after scancel; check "
                                  f"`squeue -j {alloc.job}`")
        self._alloc_file.unlink(missing_ok=True)
        self._alloc = None

    def close(self) -> None:
        return None

