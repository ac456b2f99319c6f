"""What several commands accept and report the same way: a CLUSTER argument that may be a topology
file, and a topology that does not load."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from epdctl.errors import EpdctlError, Reported, TopologyError
from epdctl.state.store import list_clusters


def cluster_arg(arg: str | None) -> str | None:
    """CLUSTER or TOPOLOGY file -> cluster name (a topology's cluster is named after it)."""
    if arg and (arg.endswith((".yaml", ".yml")) or "/" in arg) and Path(arg).is_file():
        from epdctl.topology import load_topology

        return load_topology(Path(arg)).name
    return arg


def complete_cluster(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """Shell completion: recorded cluster names."""
    try:
        return [n for n in list_clusters() if n.startswith(incomplete)]
    except OSError:
        return []


@contextmanager
def topology_problems(topology: str, hint: str = "") -> Iterator[None]:
    """Inside: load/render a topology. A TopologyError prints every problem (file:line, YAML path, fix),
    another EpdctlError its message; both exit 1."""
    try:
        yield
    except Reported:
        raise
    except TopologyError as e:
        click.secho(f"{topology}: {len(e.problems)} problem(s){hint}:", fg="red", err=True)
        for p in e.problems:
            click.echo(f"  {p.format(topology)}", err=True)
        raise Reported() from None
    except EpdctlError as e:
        click.secho(f"{topology}: {e}", fg="red", err=True)
        raise Reported() from None
