"""`epdctl stage TOPOLOGY`: the weights where the engines will read them (an ``hf:`` model
downloaded once into the shared cache; with ``model.stage``, a verified copy on every node's
own disk). `up` runs the same steps first, unless told ``--no-stage``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterable

import click

from epdctl.commands.args import topology_problems
from epdctl.launchers import get_launcher
from epdctl.stage import download_model, stage_nodes
from epdctl.stage.events import (Downloaded, Downloading, Event, Manifested, NodeProgress, NodeStaged,
                                 SpaceChecked)
from epdctl.state.store import ClusterDir
from epdctl.topology import load_topology
from epdctl.topology.model import Topology


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


class StagePrinter:
    """One line per event; per node progress at most once a second (and its last line)."""

    def __init__(self, every: float = 1.0):
        self.every = every
        self.shown: dict[str, float] = {}

    def __call__(self, events: Iterable[Event]) -> None:
        for ev in events:
            self.show(ev)

    def show(self, ev: Event) -> None:
        if isinstance(ev, Downloading):
            click.echo(f"weights: {ev.source}: downloading what {ev.cache} lacks (here, once)")
        elif isinstance(ev, Downloaded):
            click.echo(f"weights: {ev.source} is commit {ev.commit}: {ev.files} files, {_size(ev.bytes)} in "
                       f"{ev.snapshot} ({ev.seconds:.1f}s)")
        elif isinstance(ev, Manifested):
            how = "unchanged" if ev.reused else "written"
            click.echo(f"weights: manifest {how}: {ev.files} files, {_size(ev.bytes)}, sha256 {ev.digest[:16]} "
                       f"({ev.path})")
        elif isinstance(ev, SpaceChecked):
            click.echo(f"  [{ev.node}] room: {_size(ev.free)} free, the copy needs {_size(ev.need)}")
        elif isinstance(ev, NodeProgress):
            now = time.monotonic()
            key = f"{ev.node}/{ev.phase}"
            if ev.done < ev.total and now - self.shown.get(key, 0.0) < self.every:
                return
            if ev.total == 0 or ev.done == 0:
                return
            self.shown[key] = now
            pct = 100.0 * ev.done / ev.total
            click.echo(f"  [{ev.node}] {ev.phase} {_size(ev.done)} / {_size(ev.total)} ({pct:.0f}%) "
                       f"{_size(ev.rate)}/s")
        elif isinstance(ev, NodeStaged):
            what = [f"{len(ev.copied)} copied"] if ev.copied else []
            if ev.recopied:
                what.append(f"{len(ev.recopied)} re-copied, differed from the manifest: {', '.join(ev.recopied)}")
            what.append(f"{ev.kept} already there and verified")
            click.secho(f"  [{ev.node}] staged and verified in {ev.seconds:.1f}s: {'; '.join(what)}", fg="green")


def run_stage(topo: Topology, topology: Path, launcher: Any, run_dir: Path, show: StagePrinter) -> Topology:
    """Download (hf:), then stage (model.stage); the topology reloaded once the snapshot is known."""
    if topo.model.hub is not None:
        show(download_model(topo))
        topo = load_topology(topology)
    if topo.model.stage is not None:
        show(stage_nodes(topo, launcher, run_dir))
        click.echo(f"weights: engines read {topo.model.path} on every node")
    return topo


@click.command("stage")
@click.argument("topology", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--accept-new-host-keys", is_flag=True,
              help="ssh launcher: trust and record the host keys of nodes never seen before.")
def stage(topology: Path, accept_new_host_keys: bool) -> None:
    """Put TOPOLOGY's weights where its engines read them: download an hf: model once into
    model.cache (on this machine), and with model.stage copy it to every node's own disk at once,
    each copy checked against a manifest (file, size, SHA-256)."""
    with topology_problems(str(topology)):
        topo = load_topology(topology)
        if topo.model.hub is None and topo.model.stage is None:
            click.echo(f"weights: {topo.model.path} is read where it is (no hf: and no model.stage): "
                       f"nothing to stage")
            return
        cdir = ClusterDir(topo.name)
        launcher = get_launcher(topo.launcher, cdir.root, topo, accept_new_host_keys) \
            if topo.model.stage is not None else None
        t0 = time.monotonic()
        try:
            run_stage(topo, topology, launcher, cdir.root, StagePrinter())
            held = launcher.holding([]) if launcher is not None else None
        finally:
            if launcher is not None:
                launcher.close()
        click.secho(f"weights ready in {time.monotonic() - t0:.1f}s", fg="green")
        if held is not None:  # staged inside an allocation: the workers must start in the same one
            click.echo(f"the copies are on the nodes of allocation {held.job}, which stays: `epdctl up "
                       f"{topology}` starts the workers there (`scancel {held.job}` gives it back unused)")
