"""The store directories a cluster's transfer writes into (vLLM's ExampleConnector and
ECExampleConnector under ``transfer.backend: shared-storage``): `up` makes each one empty before
the workers start, so no file of an earlier run is read as this run's, and `down` removes them
once every process stopped. The engines never prune them: whatever holds the cluster does.

The store lives on the nodes, so each node's directories are handled by one short program run
there the way the launcher runs programs to completion on its nodes (``Launcher.node_jobs``):
a process on this machine, a command over the launcher's SSH connections, a job step inside the
SLURM allocation. All nodes at once; never a local ``rm`` of a path that is the node's.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from epdctl.errors import EpdctlError, LaunchError
from epdctl.launchers.base import Launcher, Results
from epdctl.launchers.streams import LineStream

# argv: "fresh"|"remove" DIR...; refuses what cannot be a store epdctl made. Nodes that share
# the store's filesystem (``shared: true``) run this on the same directory at once: a removal
# that races another node's is tried again, and the directory may already be there.
_CODE = """
import os, shutil, sys, time
how, dirs = sys.argv[1], sys.argv[2:]
for d in dirs:
    if not os.path.isabs(d) or os.path.realpath(d) in ("/", os.path.expanduser("~")):
        sys.exit("refusing to touch " + repr(d))
    for _ in range(10):
        shutil.rmtree(d, ignore_errors=True)
        if not os.path.exists(d):
            break
        time.sleep(0.2)
    else:
        sys.exit("could not remove " + d)
    if how == "fresh":
        os.makedirs(d, mode=0o700, exist_ok=True)
"""


def _each(launcher: Launcher, stores: Mapping[str, Sequence[str]], how: str) -> Results[None]:
    res = Results[None]()
    todo = {node: list(dirs) for node, dirs in stores.items() if dirs}
    if not todo:
        return res

    def failed(node: str, why: object) -> None:
        res.failed[node] = LaunchError(f"[{node}] store {' '.join(todo[node])}: {why}")

    try:
        jobs = launcher.node_jobs(list(todo))
    except EpdctlError as e:  # e.g. no allocation to run a step in, a node that cannot be reached
        for node in todo:
            failed(node, e)
        return res
    running: dict[str, LineStream] = {}
    for node, dirs in todo.items():  # every node at once (an ssh session, a SLURM step each)
        job = jobs[node]
        try:
            running[node] = job.start([job.python, "-c", _CODE, how, *dirs], b"")
        except EpdctlError as e:
            failed(node, e)
    for node, stream in running.items():
        try:
            out = "".join(stream.lines())
            rc, err = stream.finish()
        except (EpdctlError, OSError) as e:
            failed(node, e)
            continue
        if rc == 0:
            res.ok[node] = None
        else:
            failed(node, (err or out).strip()[-300:] or f"exit status {rc}")
    return res


def prepare(launcher: Launcher, stores: Mapping[str, Sequence[str]]) -> None:
    """Every store empty and owned by this cluster; LaunchError naming each node that failed."""
    _each(launcher, stores, "fresh").raise_if_failed("preparing the transfer store")


def remove(launcher: Launcher, stores: Mapping[str, Sequence[str]]) -> Results[None]:
    """Remove every store directory (``down``, after its processes stopped, before the launcher
    gives back what holds the nodes)."""
    return _each(launcher, stores, "remove")
