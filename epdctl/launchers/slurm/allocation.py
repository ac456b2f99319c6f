"""The allocation a SLURM cluster runs in: obtain it (adopt ``$SLURM_JOB_ID`` or submit a holder
job and wait, bounded, for it to run), map the topology's nodes onto it, record it in the run
folder, report its state, give it back.

Why its own module: the allocation outlives every worker step (a step that dies, or that
`rebalance` stops, leaves it running), so its life - queue wait, end, cause of the end - is a
separate question from starting and stopping steps (``slurm.launcher``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from epdctl.errors import LaunchError
from epdctl.launchers.base import Holding
from epdctl.render.plan import build_plan
from epdctl.launchers.slurm import jobs, steps
from epdctl.launchers.slurm.sbatch import directives, slurm_nodes
from epdctl.topology.model import Topology

ALLOC_FILE = "slurm-job.json"


@dataclass(frozen=True)
class Allocation:
    """The job that holds the cluster's nodes, and the topology -> SLURM node map."""

    job: str
    owned: bool                          # epdctl submitted it (and `down` cancels it)
    nodes: dict[str, list[str]]          # topology node -> [SLURM node name, address]
    hosts: dict[str, str]                # topology address -> allocated address
    python: dict[str, str]               # topology node -> python to run ("" = as planned)


def holder_script(topo: Topology, nodes: int, output: str) -> str:
    """The batch script that holds the allocation: no worker, just a sleep until scancel."""
    lines = ["#!/usr/bin/env bash",
             f"# epdctl allocation for cluster {topo.name}: the workers run as job steps that",
             "# `epdctl up` / `rebalance` start with `srun --jobid $SLURM_JOB_ID --overlap`;",
             "# `epdctl down` stops them and cancels this job."]
    lines += [f"#SBATCH --{k}" + (f"={v}" if v != "" else "")
              for k, v in directives(topo, nodes, output=output,
                                     max_gpus=max((n.gpus for n in topo.nodes), default=0))]
    lines += ['echo "epdctl: allocation $SLURM_JOB_ID holds $SLURM_JOB_NODELIST"',
              "exec sleep infinity", ""]
    return "\n".join(lines)


def recorded(cluster_dir: Path) -> Allocation | None:
    """The allocation `up` recorded in the run folder, if any."""
    path = cluster_dir / ALLOC_FILE
    if not path.exists():
        return None
    try:
        return Allocation(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as e:
        raise LaunchError(f"{path} is damaged ({e}); `epdctl down --force` stops the cluster's "
                          f"steps, then check `squeue --me` for the job") from None


Announce = Callable[[str, bool], None]   # (job id, owned) as soon as the job id is known


def obtain(cluster_dir: Path, topo: Topology, timeout: float,
           announce: Announce | None = None) -> Allocation:
    """Adopt ``$SLURM_JOB_ID`` or submit a holder job (``announce``: told the job id at once,
    before the wait in the queue); wait at most ``timeout`` seconds for it to run (then cancel
    it: nothing is left queued), map the nodes, record it."""
    adopted = os.environ.get("SLURM_JOB_ID")
    job = adopted or _submit(cluster_dir, topo)
    if announce is not None:
        announce(job, not adopted)
    try:
        alloc = _map(topo, job, owned=not adopted, timeout=timeout)
    except BaseException:
        if not adopted:
            jobs.cancel([job])
        raise
    (cluster_dir / ALLOC_FILE).write_text(json.dumps(asdict(alloc), indent=2))
    return alloc


def _submit(cluster_dir: Path, topo: Topology) -> str:
    used = slurm_nodes(topo, build_plan(topo))
    cluster_dir.mkdir(parents=True, exist_ok=True)
    script = cluster_dir / "job.sbatch"
    script.write_text(holder_script(topo, len(used), str(cluster_dir / "job-%j.out")))
    return jobs.submit(str(script), ["--chdir", str(cluster_dir)])


def _map(topo: Topology, job: str, owned: bool, timeout: float) -> Allocation:
    """Wait until the job runs, then map the topology's nodes onto its nodes in order."""
    t0 = time.monotonic()
    while True:
        info = jobs.poll([job])[job]
        if info.state == "RUNNING":
            break
        if info.hopeless:
            raise LaunchError(f"SLURM job {job} can never start: {info.hopeless} (squeue "
                              f"reason {info.reason}); compare the topology with `sinfo -N -l`")
        if not info.active:
            raise LaunchError(f"SLURM job {job} ended as {info.state} before it ran")
        if time.monotonic() - t0 > timeout:
            raise LaunchError(f"SLURM job {job} still {info.state} ({info.reason}) after "
                              f"{timeout:.0f}s in the queue; it was cancelled. Raise "
                              f"--timeout, or check the queue with `squeue -j {job}`")
        time.sleep(0.3)
    plan = build_plan(topo)
    want = slurm_nodes(topo, plan)
    got = steps.node_addresses(info.nodes)
    if len(got) < len(want):
        raise LaunchError(f"SLURM job {job} has {len(got)} node(s) ({info.nodes}); the "
                          f"topology needs {len(want)} ({', '.join(want)})")
    nodes = {t: list(got[i]) for i, t in enumerate(want)}
    hosts = {topo.node(t).host: got[i][1] for i, t in enumerate(want)}
    python = {t: ("" if plan.setup.get(t) else sys.executable) for t in want}
    return Allocation(job=job, owned=owned, nodes=nodes, hosts=hosts, python=python)


def job_end(job: str, settle: float = 3.0) -> str | None:
    """Why ``job`` no longer runs, or None while it runs. A job the scheduler is ending shows
    COMPLETING for a moment before its final state (TIMEOUT, CANCELLED, NODE_FAIL ...): wait
    ``settle`` seconds for that state, which says what to change."""
    deadline = time.monotonic() + settle
    while True:
        info = jobs.poll([job])[job]
        if info.state == "RUNNING":
            return None
        if info.state != "COMPLETING" or time.monotonic() > deadline:
            return jobs.ended(info)
        time.sleep(0.3)


def holding(alloc: Allocation, ended_first: Sequence[tuple[str, str]] = ()) -> Holding:
    """The allocation's state for `status`; when it ended, why, and the worker whose step
    ended for good first (``ended_first``: (worker, last exit) oldest first), if any."""
    info = jobs.poll([alloc.job])[alloc.job]
    if info.state == "RUNNING":
        return Holding(alloc.job, info.state, owned=alloc.owned)
    why = job_end(alloc.job) or jobs.ended(info)
    state = jobs.poll([alloc.job])[alloc.job].state
    if state == "GONE":
        why = f"SLURM job {alloc.job} is no longer known to the scheduler (it ended)"
    if ended_first:
        worker, cause = ended_first[0]
        why += f"; the first worker to end was {worker} ({cause})"
    return Holding(alloc.job, state, why + "; `epdctl down` cleans up the record", owned=alloc.owned)
