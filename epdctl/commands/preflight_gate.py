"""The node preflight `epdctl up` runs before it starts anything.

Why in `up`: a missing model, a locked-memory limit or a dead GPU otherwise shows up minutes later
as one worker that never turns healthy; the same node checks as `epdctl check TOPOLOGY` (without
--links, which moves real traffic) take about a second and name the cause before launch.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

import click

from epdctl.errors import LaunchError
from epdctl.preflight.run import CheckReport, run_check
from epdctl.preflight.runners import LocalRunner, NodeRunner
from epdctl.preflight.targets import runners_for, used_nodes


def _runners(topo: Any, launcher: str) -> Mapping[str, NodeRunner]:
    """Reach the nodes the way the chosen launcher will (``--launcher local`` overrides the
    topology's launcher, so its nodes are this machine)."""
    if launcher == "local":
        python = sys.executable if topo.python in ("python", "python3") else topo.python
        return {n: LocalRunner(n, python=python) for n in used_nodes(topo)}
    return runners_for(topo)


def _judged(report: CheckReport, launcher: str) -> CheckReport:
    """Drop the checks `up` makes itself, better. Reaching a node: the launcher's connection
    step names host-key mismatches and refused connections per node, and only it knows
    --accept-new-host-keys. Ports, for the local launcher: `up`'s own port check binds every
    planned port (prometheus ports included) and names the holder, so the preflight's
    listening-socket view would only fail first with a vaguer message."""
    skip = {"reach node", "ports"} if launcher == "local" else {"reach node"}
    return CheckReport(items=[i for i in report.items if i.check not in skip])


def _close(runners: Mapping[str, NodeRunner]) -> None:
    """Close the SSH connections the preflight opened (the launcher opens its own)."""
    pools = {id(p): p for r in runners.values()
             if (p := getattr(getattr(r, "conn", None), "pool", None)) is not None}
    for pool in pools.values():
        pool.close()


def preflight_before_up(topo: Any, plan: Any, launcher: str, *, force: bool,
                        skip: bool) -> None:
    """Run the node checks; print failures; raise unless they all pass or ``force`` is set."""
    if skip:
        click.echo("preflight: skipped (--skip-preflight)")
        return
    if launcher == "slurm":
        click.echo("preflight: skipped for launcher slurm (the nodes are known only once the "
                   "job runs); run `epdctl check` inside an allocation to check them")
        return
    runners = _runners(topo, launcher)
    try:
        report = _judged(run_check(topo, runners, plan=plan), launcher)
    finally:
        _close(runners)
    failed = [i for i in report.items if not i.ok]
    if not failed:
        click.echo(f"preflight: {len(report.items)} node checks passed")
        return
    lines = [f"  [{i.node}] {i.check}: {i.detail}" for i in failed]
    msg = f"preflight: {len(failed)} of {len(report.items)} node checks failed:\n" + \
        "\n".join(lines)
    if force:
        click.secho(msg + "\n--force: launching anyway", fg="yellow", err=True)
        return
    raise LaunchError(msg + "\nnothing was started; fix the above (details: `epdctl check "
                      "TOPOLOGY`), or launch anyway with --force, or skip it with "
                      "--skip-preflight")
