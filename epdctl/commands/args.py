"""What several commands accept the same way: a CLUSTER argument that may be a topology file."""

from __future__ import annotations

from pathlib import Path

import click

from epdctl.state import list_clusters


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
