"""`epdctl render TOPOLOGY`: the exact commands every node runs, as shell or JSON."""

from __future__ import annotations

import os
from pathlib import Path

import click

from epdctl.errors import EpdctlError
from epdctl.launchers.kinds import batch_kind
from epdctl.commands.args import topology_problems
from epdctl.render import build_plan, to_json, to_shell
from epdctl.topology import load_topology


@click.command("render")
@click.argument("topology", type=click.Path(dir_okay=True, path_type=str))
@click.option("--node", "node", default=None, help="Only this node's commands.")
@click.option("--format", "fmt", type=click.Choice(["sh", "json"]), default="sh", show_default=True)
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write one file per node (<node>.sh or <node>.json) plus plan.<fmt> into DIR.")
@click.option("--launcher", "launcher", type=click.Choice(["plan", "slurm"]), default="plan", show_default=True,
              help="slurm: print a ready-to-submit sbatch script instead of the per-node commands.")
@click.option("--template", "template", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="With --launcher slurm: your own jinja2 sbatch template (default: templates/sbatch.sh.j2).")
def render(topology: str, node: str | None, fmt: str, out: Path | None, launcher: str,
           template: Path | None) -> None:
    """Render the launch plan of a topology (start order: encoders, prefills, decodes, router)."""
    with topology_problems(topology, "; run `epdctl validate` for details"):
        topo = load_topology(topology)
        plan = build_plan(topo)
        batch = batch_kind(launcher)
        if batch is not None:
            from epdctl.launchers.slurm.sbatch import render_sbatch

            text = render_sbatch(topo, plan, template)
    if batch is not None:
        if out is None:
            click.echo(text, nl=False)
            return
        try:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{topo.name}.sbatch").write_text(text, encoding="utf-8")
        except OSError as e:
            raise EpdctlError(f"cannot write to {out}: {e.strerror}; pick a writable --out directory") from None
        click.echo(f"wrote {out / (topo.name + '.sbatch')}")
        return
    if node is not None and node not in plan.nodes:
        raise EpdctlError(f"node {node!r} runs nothing in this topology; nodes: {', '.join(plan.nodes)}")
    emit = to_json if fmt == "json" else to_shell
    if out is None:
        click.echo(emit(plan, node), nl=False)
        return
    try:
        out.mkdir(parents=True, exist_ok=True)
        for n in [node] if node else plan.nodes:
            path = out / f"{n}.{fmt}"
            path.write_text(emit(plan, n), encoding="utf-8")
            if fmt == "sh":
                os.chmod(path, 0o755)
        if node is None:
            (out / f"plan.{fmt}").write_text(emit(plan, None), encoding="utf-8")
    except OSError as e:
        raise EpdctlError(f"cannot write to {out}: {e.strerror}; pick a writable --out directory") from None
    click.echo(f"wrote {len(plan.nodes)} node file(s) to {out}")
