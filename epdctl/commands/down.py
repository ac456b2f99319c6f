"""`epdctl down`: stop exactly a cluster's processes, with or without a readable state.

What `down` stops: every recorded process, plus every process that carries the cluster's
marker (``EPDCTL_CLUSTER``; see launchers/supervise.py) but is not recorded — so an emptied,
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
from epdctl.launchers.lifecycle import tear_down
from epdctl.state import ClusterDir, ClusterState, list_clusters, resolve_cluster, state_root


def guess_launcher(cdir: ClusterDir) -> str:
    """The launcher of a cluster whose state is unreadable, from the files it left."""
    if (cdir.root / "ssh-nodes.json").exists():
        return "ssh"
    if (cdir.root / "slurm-job.json").exists():
        return "slurm"
    return "local"


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
    with cdir.lock("down"):
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
            res, strays = tear_down(state, launcher, grace=grace)
            polled = launcher.poll(state.processes) if state else None
            left = ([k for k, st in polled.ok.items() if st.alive] + list(polled.failed)
                    if polled else [])
        finally:
            launcher.close()
        for r in strays:
            click.echo(f"  [{r.node}/{r.name}] pid {r.pid}: not in the state but carries the "
                       "cluster's marker; stopped")
        if left or not res.all_ok:
            res.raise_if_failed(f"stopping cluster {cdir.name}")
            raise LaunchError(f"still running after down: {', '.join(left)}; run "
                              f"`epdctl down {cdir.name}` again")
        cdir.clear()
    if state is None and not strays:
        click.echo(f"cluster {cdir.name!r}: nothing recorded; nothing to stop (no process "
                   "carries its marker)")
        return
    click.secho(f"cluster {cdir.name} stopped in {time.monotonic() - t0:.1f}s; no recorded "
                "process remains, and none carries its marker", fg="green")
