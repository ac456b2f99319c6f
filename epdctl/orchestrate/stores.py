"""The store directories a cluster's transfer writes into (vLLM's ExampleConnector and
ECExampleConnector under ``transfer.backend: shared-storage``): `up` makes each one empty before
the workers start, so no file of an earlier run is read as this run's, and `down` removes them
once every process stopped. The engines never prune them: whatever holds the cluster does.

Each node's directories are handled by one command through the launcher's own way of running
things on that node (``Launcher.node_runners``: this machine, or ssh with its host-key policy).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from epdctl.errors import EpdctlError, LaunchError
from epdctl.launchers.base import Launcher, Results

# argv: "fresh"|"remove" DIR...; refuses what cannot be a store epdctl made
_CODE = """
import os, shutil, sys
how, dirs = sys.argv[1], sys.argv[2:]
for d in dirs:
    if not os.path.isabs(d) or os.path.realpath(d) in ("/", os.path.expanduser("~")):
        sys.exit("refusing to touch " + repr(d))
    shutil.rmtree(d, ignore_errors=True)
    if os.path.exists(d):
        sys.exit("could not remove " + d)
    if how == "fresh":
        os.makedirs(d, mode=0o700)
"""


def _each(launcher: Launcher, stores: Mapping[str, Sequence[str]], how: str) -> Results[None]:
    res = Results[None]()
    todo = {node: list(dirs) for node, dirs in stores.items() if dirs}
    if not todo:
        return res
    try:
        runners = launcher.node_runners(list(todo))
    except EpdctlError as e:  # e.g. a launcher that cannot reach its nodes without the topology
        return Results[None](failed={n: LaunchError(f"[{n}] store {' '.join(d)}: {e}") for n, d in todo.items()})
    for node, dirs in todo.items():
        runner = runners[node]
        try:
            done = runner.run([runner.python, "-c", _CODE, how, *dirs], timeout=60)
        except EpdctlError as e:
            res.failed[node] = LaunchError(f"[{node}] store {' '.join(dirs)}: {e}")
            continue
        if done.rc == 0:
            res.ok[node] = None
        else:
            res.failed[node] = LaunchError(f"[{node}] store {' '.join(dirs)}: "
                                           f"{(done.stderr or done.stdout).strip()[-300:]}")
    return res


def prepare(launcher: Launcher, stores: Mapping[str, Sequence[str]]) -> None:
    """Every store empty and owned by this cluster; LaunchError naming each node that failed."""
    _each(launcher, stores, "fresh").raise_if_failed("preparing the transfer store")


def remove(launcher: Launcher, stores: Mapping[str, Sequence[str]]) -> Results[None]:
    """Remove every store directory (``down``, after its processes stopped)."""
    return _each(launcher, stores, "remove")
