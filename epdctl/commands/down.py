"""`epdctl down`: stop exactly a cluster's processes, with or without a readable state.

What `down` stops: every recorded process, plus every process that carries the cluster's
marker (``EPDCTL_CLUSTER``; see node/supervise.py) but is not recorded — so an emptied,
edited or deleted state.json still leaves nothing running. What it never stops: a process
without the marker and the recorded token, whatever pid or start time a record names. A
state.json that cannot be read is refused with a message; `down --force` then stops by marker
alone and forgets the state.
"""

from __future__ import annotations

import time

import click

from epdctl.commands.args import cluster_arg, complete_cluster
from epdctl.errors import LaunchError, StateError
from epdctl.launchers import get_launcher
from epdctl.launchers.base import Results, Status
from epdctl.orchestrate import stores
from epdctl.orchestrate.lifecycle import tear_down
from epdctl.orchestrate.prometheus_sd import kept_current
from epdctl.state.store import (ClusterDir, ClusterState, ProcessRecord, list_clusters, resolve_cluster,
                          state_root)


def guess_launcher(cdir: ClusterDir) -> str:
    """The launcher of a cluster whose state is unreadable, from the files it left."""
    if (cdir.root / "ssh-nodes.json").exists():
        return "ssh"
    if (cdir.root / "slurm-job.json").exists():
        return "slurm"
    return "local"


def _not_stopped(state: ClusterState | None, res: Results[None], polled: Results[Status]
                 ) -> list[ProcessRecord]:
    """The records `down` could not stop, or cannot confirm stopped (their node did not answer)."""
    if state is None:
        return []
    return [r for r in state.processes if r.name in res.failed or r.name in polled.failed
            or (r.name in polled.ok and polled.ok[r.name].alive)]


def _unfinished(cluster: str, n_all: int, left: list[ProcessRecord], res: Results[None],
                polled: Results[Status]) -> str:
    """What stopped, what did not and why (one line per node), and how to finish."""
    why: dict[str, str] = {}
    for r in left:
        err = res.failed.get(r.name) or polled.failed.get(r.name)
        text = (str(err) or type(err).__name__).splitlines()[0] if err else "still running"
        why.setdefault(r.node, text.removeprefix(f"[{r.node}] ").removeprefix(f"[{r.node}/{r.name}] "))
    lines = [f"cluster {cluster}: stopped {n_all - len(left)} of {n_all} recorded processes"
             + (f"; not stopped on {len(why)} node(s):" if why else "; but:")]
    for node, text in why.items():
        names = ", ".join(r.name for r in left if r.node == node)
        lines.append(f"  [{node}] {names}: {text}")
    recorded = {r.name for r in left}
    for key, err in res.failed.items():
        if key in recorded:
            continue
        first = (str(err) or type(err).__name__).splitlines()
        what = "the search for unrecorded processes" if key == "(search)" else key
        lines.append(f"  {what}: {' '.join(ln.strip() for ln in first[:3])}")
    unreachable = any(r.name in polled.failed for r in left)
    lines.append("their records stay in the state: " + (
        f"once the node(s) answer again (check with `epdctl status {cluster}`), " if unreachable
        else "") + f"run `epdctl down {cluster}` to finish")
    return "\n".join(lines)


def _pick(name: str | None) -> ClusterDir | None:
    if name is not None:
        return ClusterDir(name)
    if not list_clusters():
        click.echo(f"no cluster is recorded under {state_root()}; nothing to stop")
        return None
    return resolve_cluster(None)


@click.command()
@click.argument("cluster", required=False, shell_complete=complete_cluster)
@click.option("--grace", type=float, default=15.0, show_default=True,
              help="Seconds to wait after SIGTERM before SIGKILL.")
@click.option("--force", is_flag=True,
              help="The state file is damaged: stop every process carrying the cluster's "
                   "marker (nothing else) and forget the state.")
def down(cluster: str | None, grace: float, force: bool) -> None:
    """Stop every process of CLUSTER and confirm nothing remains (idempotent)."""
    cdir = _pick(cluster_arg(cluster))
    if cdir is None:
        return
    t0 = time.monotonic()
    kept: dict[str, Exception] = {}  # node -> why its transfer store is still there
    with cdir.lock("down"), kept_current(cdir):
        state: ClusterState | None
        try:
            state = cdir.load()
        except StateError as e:
            if not force:
                raise
            click.echo(f"warning: {str(e).split('. ', 1)[0]}; stopping by marker", err=True)
            state = None
        if state is not None:
            state.phase = "stopping"
            cdir.save(state)
        launcher = get_launcher(state.launcher if state else guess_launcher(cdir), cdir.root)
        n = len(state.processes) if state else 0
        click.echo(f"stopping cluster {cdir.name} ({n} recorded processes) ...")
        try:
            res, strays = tear_down(state, launcher, grace=grace, release=False)
            polled = launcher.poll(state.processes) if state else Results[Status]()
            if state is not None and state.stores and res.all_ok:
                # on the nodes, the way the launcher runs programs there (SLURM: a step of the
                # allocation, which is why it is given back only after this)
                gone = stores.remove(launcher, state.stores)
                kept = gone.failed
                if gone.ok:
                    click.echo(f"removed the transfer store on {', '.join(gone.ok)}: "
                               f"{', '.join(sorted({d for ds in state.stores.values() for d in ds}))}")
            if res.all_ok:
                launcher.release()
        finally:
            launcher.close()
        for r in strays:
            click.echo(f"  [{r.node}/{r.name}] pid {r.pid}: not in the state but carries the "
                       "cluster's marker; stopped")
        left = _not_stopped(state, res, polled)
        if left or not res.all_ok:
            if state is not None:  # what did stop is forgotten; what did not stays for a later down
                n_all, state.processes = len(state.processes), left
                cdir.save(state)
                raise LaunchError(_unfinished(cdir.name, n_all, left, res, polled))
            res.raise_if_failed(f"stopping cluster {cdir.name}")
        cdir.clear()
    if kept:  # every process stopped and is forgotten; only files are left, said where
        lines = "\n".join(f"  {e}" for e in kept.values())
        raise LaunchError(f"cluster {cdir.name} stopped, but its transfer store is still on "
                          f"{len(kept)} node(s):\n{lines}\nremove it there by hand")
    if state is None and not strays:
        click.echo(f"cluster {cdir.name!r}: nothing recorded; nothing to stop (no process "
                   "carries its marker)")
        return
    click.secho(f"cluster {cdir.name} stopped in {time.monotonic() - t0:.1f}s; no recorded "
                "process remains, and none carries its marker", fg="green")
