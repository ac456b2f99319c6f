"""Talk to SLURM's command-line tools: submit, poll, cancel.

Every parser is a pure function over the tools' text so it is tested with recorded outputs;
the thin wrappers below run the tool once. Polling asks ONE ``squeue`` for all job ids (the
scheduler is shared; one call per job per second is how launchers get banned), and never uses
``sbatch --wait``, which polls at a growing interval (2 s, 10 s ...).
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Iterable, Sequence

from epdctl.errors import LaunchError

log = logging.getLogger(__name__)

SQUEUE_FORMAT = "%i|%T|%r|%N|%P|%l|%M"
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING",
          "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "REQUEUE_HOLD", "REQUEUE_FED")
# Pending reasons that will never clear by waiting: the request does not fit the partition.
HOPELESS = {
    "PartitionConfig": "the job asks for more nodes/CPUs/GPUs than partition {partition} has",
    "PartitionNodeLimit": "the job asks for more nodes than partition {partition} allows",
    "PartitionTimeLimit": "the job's time limit exceeds partition {partition}'s MaxTime",
    "PartitionDown": "partition {partition} is down",
    "PartitionInactive": "partition {partition} is inactive",
    "BadConstraints": "no node of partition {partition} matches the job's constraints",
    "InvalidAccount": "the account is not valid on this cluster",
    "InvalidQOS": "the QOS is not valid on this cluster",
    "AssocMaxNodesPerJobLimit": "the account's association limits the number of nodes per job",
    "QOSMaxNodePerJobLimit": "the QOS limits the number of nodes per job",
}
_SBATCH_HINTS = (
    (re.compile(r"invalid partition", re.I), "unknown partition: set slurm.partition to one `sinfo -s` lists"),
    (re.compile(r"Requested node configuration is not available", re.I),
     "no node set of the partition can satisfy the request (too many nodes, GPUs or CPUs per node); "
     "compare the topology's node count and slurm.gpus_per_node with `sinfo -N -l`"),
    (re.compile(r"Node count specification invalid", re.I),
     "the partition does not have that many nodes; compare with `sinfo -s`"),
    (re.compile(r"Invalid generic resource \(gres\) specification", re.I),
     "the cluster has no such GPUs (gres): check slurm.gpus_per_node against `sinfo -o '%N %G'`"),
    (re.compile(r"Invalid account", re.I), "unknown account: set slurm.account to one `sacctmgr show assoc` lists"),
    (re.compile(r"Requested time limit is invalid", re.I),
     "slurm.time exceeds the partition's MaxTime (see `sinfo -o '%P %l'`)"),
)


@dataclass(frozen=True)
class JobInfo:
    """One line of ``squeue``: the scheduler's view of a job."""

    job_id: str
    state: str        # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ... or GONE (purged)
    reason: str       # pending reason, or "None"
    nodes: str        # compressed node list, e.g. node[1-3]
    partition: str = ""
    time_limit: str = ""
    elapsed: str = ""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def hopeless(self) -> str | None:
        """Why a PENDING job can never start, or None when waiting may help."""
        if self.state != "PENDING":
            return None
        why = HOPELESS.get(self.reason)
        return why.format(partition=self.partition or "(default)") if why else None


def ended(info: JobInfo) -> str:
    """Why a job no longer runs, and what to change when the scheduler says it."""
    why = f"SLURM job {info.job_id} ended as {info.state}"
    if info.reason not in ("", "None"):
        why += f" ({info.reason})"
    if info.state == "TIMEOUT":
        why += ": it reached its time limit: raise slurm.time in the topology"
    return why


def parse_job_id(out: str) -> str:
    """``sbatch --parsable`` prints ``ID`` or ``ID;CLUSTER``."""
    first = out.strip().splitlines()[-1].strip() if out.strip() else ""
    job = first.split(";", 1)[0]
    if not job.isdigit():
        raise LaunchError(f"could not read a job id from sbatch's output {out.strip()!r}")
    return job


def explain_sbatch_error(stderr: str) -> str:
    """sbatch's error plus what to change: the raw line alone rarely says which setting is wrong."""
    lines = [ln.removeprefix("sbatch: error: ").strip() for ln in stderr.strip().splitlines() if ln.strip()]
    raw = "; ".join(dict.fromkeys(lines)) or "sbatch failed without a message"
    for pattern, hint in _SBATCH_HINTS:
        if pattern.search(stderr):
            return f"{raw} ({hint})"
    return raw


def parse_squeue(out: str) -> dict[str, JobInfo]:
    """Lines of ``squeue --noheader --format=SQUEUE_FORMAT`` -> job id -> JobInfo."""
    jobs: dict[str, JobInfo] = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 4 or not parts[0]:
            continue
        parts += [""] * (7 - len(parts))
        jid = parts[0].split("_", 1)[0]
        jobs[jid] = JobInfo(job_id=jid, state=parts[1].split()[0] if parts[1] else "UNKNOWN", reason=parts[2],
                            nodes=parts[3], partition=parts[4], time_limit=parts[5], elapsed=parts[6])
    return jobs


def parse_scontrol_record(line: str) -> dict[str, str]:
    """One ``scontrol show -o`` record (``Key=Value Key=Value``) -> dict; values may not contain spaces."""
    out: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            out[key] = value
    return out


def parse_hostnames(out: str) -> list[str]:
    """``scontrol show hostnames LIST``: one host per line."""
    return [ln.strip() for ln in out.splitlines() if ln.strip()]


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise LaunchError(f"{name!r} not found on PATH: run epdctl on a SLURM login node (or start the local "
                          f"test cluster with scripts/slurm_local.sh up and export SLURM_CONF)")
    return path


def _run(argv: Sequence[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([_tool(argv[0]), *argv[1:]], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise LaunchError(f"`{' '.join(argv)}` did not answer within {timeout:.0f}s; is slurmctld up?") from e


def submit(script: str, args: Sequence[str] = (), env: dict[str, str] | None = None) -> str:
    """``sbatch --parsable [args] SCRIPT`` -> job id; LaunchError saying what to change."""
    try:
        proc = subprocess.run([_tool("sbatch"), "--parsable", *args, script], capture_output=True, text=True,
                              timeout=60, env=env)
    except subprocess.TimeoutExpired as e:
        raise LaunchError("sbatch did not answer within 60s; is slurmctld up?") from e
    if proc.returncode != 0:
        raise LaunchError(f"sbatch rejected the job: {explain_sbatch_error(proc.stderr)}")
    return parse_job_id(proc.stdout)


def check_fits(script: str, args: Sequence[str] = ()) -> tuple[bool, str]:
    """``sbatch --test-only``: would the request fit? (ok, sbatch's message)."""
    proc = _run(["sbatch", "--test-only", *args, script])
    msg = proc.stderr.strip()
    return proc.returncode == 0, (msg if proc.returncode == 0 else explain_sbatch_error(msg))


def poll(job_ids: Iterable[str]) -> dict[str, JobInfo]:
    """The state of every job in ONE squeue call; jobs the controller forgot come back as GONE."""
    ids = sorted(set(job_ids), key=int)
    if not ids:
        return {}
    proc = _run(["squeue", "--noheader", "--states=all", f"--jobs={','.join(ids)}", f"--format={SQUEUE_FORMAT}"])
    if proc.returncode != 0 and "Invalid job id" not in proc.stderr:
        raise LaunchError(f"squeue failed: {proc.stderr.strip() or proc.stdout.strip()}")
    jobs = parse_squeue(proc.stdout) if proc.returncode == 0 else {}
    return {j: jobs.get(j, JobInfo(job_id=j, state="GONE", reason="None", nodes="")) for j in ids}


def job_record(job_id: str) -> dict[str, str]:
    """``scontrol show job -o ID`` as a dict ({} when the controller no longer knows the job)."""
    proc = _run(["scontrol", "show", "job", "-o", job_id])
    return parse_scontrol_record(proc.stdout) if proc.returncode == 0 else {}


def cancel(job_ids: Iterable[str], timeout: float = 60.0, interval: float = 0.2) -> list[str]:
    """``scancel`` the jobs and wait until none is active; returns the ids still active at timeout."""
    ids = sorted(set(job_ids), key=int)
    if not ids:
        return []
    proc = _run(["scancel", *ids])
    if proc.returncode != 0 and "Invalid job id" not in proc.stderr:
        raise LaunchError(f"scancel {' '.join(ids)} failed: {proc.stderr.strip()}")
    deadline = time.monotonic() + timeout
    while True:
        left = [j for j, info in poll(ids).items() if info.active]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(interval)
