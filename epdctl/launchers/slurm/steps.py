"""Job steps inside an allocation: start (srun --overlap), list (squeue --steps), cancel.

Pure parsers over the tools' text (tested with recorded output) plus thin wrappers that run
each tool once for many steps: one ``squeue --steps`` answers for every worker of a cluster.
"""

from __future__ import annotations

import time
from typing import Sequence

from epdctl.errors import LaunchError
from epdctl.launchers.slurm.jobs import _run, parse_hostnames, parse_scontrol_record

STEP_FORMAT = "%i|%j"


def srun_argv(job: str, node: str, name: str, log: str, command: str, options: Sequence[str] = ()) -> list[str]:
    """One worker as its own step on one node of allocation ``job``.

    ``--overlap``: steps share the allocation's CPUs (the holder's sleep and other workers);
    ``--kill-on-bad-exit``: a dying rank ends its step; output appends to the worker's log;
    ``options``: the step's container (pyxis ``--container-image=...``, SLURM ``--container=``)."""
    return ["srun", f"--jobid={job}", "--overlap", "--nodes=1", "--ntasks=1",
            f"--nodelist={node}", f"--job-name={name}", f"--output={log}", "--open-mode=append",
            "--kill-on-bad-exit=1", *options, "bash", "-c", command]


def parse_steps(out: str) -> dict[str, str]:
    """Lines of ``squeue --steps --noheader --format='%i|%j'`` -> step id (J.S) -> step name."""
    steps: dict[str, str] = {}
    for line in out.splitlines():
        sid, sep, name = line.strip().partition("|")
        if sep and "." in sid:
            steps[sid] = name
    return steps


def by_name(steps: dict[str, str]) -> dict[str, str]:
    """step name -> the newest step id with that name (a restarted worker gets a new step)."""
    out: dict[str, str] = {}
    for sid, name in sorted(steps.items(), key=lambda kv: _step_number(kv[0])):
        out[name] = sid
    return out


def _step_number(sid: str) -> int:
    tail = sid.split(".", 1)[1]
    return int(tail) if tail.isdigit() else -1


def list_steps(job: str) -> dict[str, str]:
    """The job's running steps (batch/extern steps included), in ONE squeue call."""
    proc = _run(["squeue", "--steps", "--noheader", f"--jobs={job}", f"--format={STEP_FORMAT}"])
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:
            return {}
        raise LaunchError(f"squeue --steps failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return parse_steps(proc.stdout)


def cancel_steps(step_ids: Sequence[str], grace: float = 10.0) -> list[str]:
    """SIGTERM the steps (``scancel --signal=TERM J.S ...``: a worker drains and exits), then
    after ``grace`` seconds cancel what is left (SIGKILL); returns the steps still listed."""
    ids = list(step_ids)
    if not ids:
        return []
    _scancel(["--signal=TERM", *ids])
    left = _wait_gone(ids, grace)
    if left:
        _scancel(left)
        left = _wait_gone(left, 30.0)
    return left


def _scancel(args: list[str]) -> None:
    proc = _run(["scancel", *args])
    if proc.returncode != 0 and "Invalid job id" not in proc.stderr:
        raise LaunchError(f"scancel {' '.join(args)} failed: {proc.stderr.strip()}")


def _wait_gone(ids: list[str], timeout: float) -> list[str]:
    jobs = {sid.split(".", 1)[0] for sid in ids}
    deadline = time.monotonic() + timeout
    while True:
        live: set[str] = set()
        for job in jobs:
            live |= set(list_steps(job))
        left = [s for s in ids if s in live]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def node_addresses(nodelist: str) -> list[tuple[str, str]]:
    """A compressed node list (node[1-3]) -> [(name, NodeAddr)] in allocation order."""
    proc = _run(["scontrol", "show", "hostnames", nodelist])
    if proc.returncode != 0:
        raise LaunchError(f"scontrol show hostnames {nodelist} failed: {proc.stderr.strip()}")
    out = []
    for name in parse_hostnames(proc.stdout):
        rec = _run(["scontrol", "show", "node", "-o", name])
        addr = parse_scontrol_record(rec.stdout).get("NodeAddr") if rec.returncode == 0 else None
        out.append((name, addr or name))
    return out
