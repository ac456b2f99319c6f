"""`epdctl validate TOPOLOGY`: every problem with file, line, YAML path and a fix; exit 0 or 1."""

from __future__ import annotations

import sys

import click

from epdctl.errors import EpdctlError, TopologyError
from epdctl.render import build_plan
from epdctl.topology import load_topology
from epdctl.topology.model import Role
from epdctl.topology.weights import switchable_memory


@click.command("validate")
@click.argument("topology", type=click.Path(dir_okay=True, path_type=str))
def validate(topology: str) -> None:
    """Check a topology file (schema, placement, ports, engine flags) without starting anything."""
    try:
        topo = load_topology(topology)
        plan = build_plan(topo)
    except TopologyError as e:
        click.secho(f"{topology}: {len(e.problems)} problem(s):", fg="red", err=True)
        for p in e.problems:
            click.echo(f"  {p.format(topology)}", err=True)
        sys.exit(1)
    except EpdctlError as e:
        click.secho(f"{topology}: {e}", fg="red", err=True)
        sys.exit(1)
    counts = ", ".join(f"{len(topo.role_workers(r))} {r.value}" for r in Role if topo.role_workers(r))
    router = f", router {topo.router.implementation} on {topo.router.node}" if topo.router else ""
    procs = len(plan.workers) + (1 if plan.router else 0)
    click.echo(f"OK: {topo.name}: engine {topo.engine}, {len(topo.nodes)} node(s), {counts}{router}; "
               f"{procs} process(es) planned")
    for line in switchable_memory(topo):
        click.echo(f"  {line}")
