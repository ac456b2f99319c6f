"""`epdctl validate TOPOLOGY [--fix]`: every problem with file, line, YAML path and a fix; exit 0 or 1.

Warnings name flags SGLang deprecated or reads as abbreviations, with the exact replacement;
``--fix`` rewrites the file (comments kept) with every migration, then validates again.
"""

from __future__ import annotations


import click

from epdctl.commands.args import topology_problems
from epdctl.errors import EpdctlError
from epdctl.render import build_plan
from epdctl.topology import load_topology, require_artifacts
from epdctl.topology.fixes import Fix, find_fixes
from epdctl.topology.loader import load_document
from epdctl.topology.model import Role
from epdctl.topology.weights import switchable_memory


def _advice(topology: str) -> list[Fix]:
    try:
        return find_fixes(load_document(topology))
    except EpdctlError:
        return []  # the unreadable file is reported by the real load below


def _engine(topology: str) -> str:
    data = load_document(topology).data
    return str(data.get("engine")) if isinstance(data, dict) else "sglang"


@click.command("validate")
@click.argument("topology", type=click.Path(dir_okay=True, path_type=str))
@click.option("--fix", "fix", is_flag=True,
              help="Rewrite the file: migrate removed/deprecated/abbreviated engine flags (comments are kept).")
def validate(topology: str, fix: bool) -> None:
    """Check a topology file (schema, placement, ports, engine flags) without starting anything."""
    fixes = _advice(topology)
    if fix and fixes:
        from epdctl.topology.rewrite import apply_fixes  # ruamel only when rewriting

        try:
            apply_fixes(topology, fixes, _engine(topology))
        except EpdctlError as e:
            raise EpdctlError(f"{topology}: {e}") from None
        for f in fixes:
            where = f"{topology}:{f.line}" if f.line else topology
            for msg in f.messages():
                click.echo(f"  fixed {where}, {f.path}: {msg}", err=True)
        fixes = _advice(topology)
    for f in fixes:
        where = f"{topology}:{f.line}" if f.line else topology
        for msg in f.messages(warnings_only=True):
            click.secho(f"  warning: {where}, {f.path}: {msg} (`epdctl validate --fix` rewrites it)", fg="yellow",
                        err=True)
    with topology_problems(topology):
        topo = load_topology(topology)
        require_artifacts(topo, topology)
        plan = build_plan(topo)
    counts = ", ".join(f"{len(topo.role_workers(r))} {r.value}" for r in Role if topo.role_workers(r))
    router = f", router {topo.router.implementation} on {topo.router.node}" if topo.router else ""
    procs = len(plan.workers) + (1 if plan.router else 0)
    click.echo(f"OK: {topo.name}: engine {topo.engine}, {len(topo.nodes)} node(s), {counts}{router}; "
               f"{procs} process(es) planned")
    for line in switchable_memory(topo):
        click.echo(f"  {line}")
