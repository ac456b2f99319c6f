"""The node preflight `epdctl up` runs before it starts anything.

Why in `up`: a missing model, a locked-memory limit or a dead GPU otherwise shows up minutes later
as one worker that never turns healthy; the same node checks as `epdctl check TOPOLOGY` (without
--links, which moves real traffic) take about a second and name the cause before launch.

Why through the launcher: it alone knows how its nodes are reached (this machine, SSH with its
host-key policy and --accept-new-host-keys, or not at all before a SLURM allocation exists), so
the preflight asks it (``Launcher.node_runners``, ``nodes_known``) and never its name.
"""

from __future__ import annotations

from typing import Any

import click

from epdctl.errors import LaunchError
from epdctl.launchers.base import Launcher
from epdctl.preflight.run import CheckReport, run_check
from epdctl.preflight.targets import runners_for
from epdctl.topology.model import Topology
from epdctl.render.plan import Plan


def _judged(report: CheckReport, launcher: Launcher) -> CheckReport:
    """Drop the checks `up` makes itself, better. Ports, for a launcher whose processes run
    here: `up`'s own port check binds every planned port (prometheus ports included) and names
    the holder, so the preflight's listening-socket view would only fail first, more vaguely."""
    skip = {"ports"} if launcher.runs_here else set()
    return CheckReport(items=[i for i in report.items if i.check not in skip], facts=report.facts)


def _line(item: Any) -> str:
    detail = str(item.detail).removeprefix(f"[{item.node}] ")  # a connection error names it
    what = "unreachable" if item.check == "reach node" else item.check
    return f"  [{item.node}] {what}: {detail}"


def preflight_before_up(topo: Topology, plan: Plan, launcher: Launcher, *, force: bool,
                        skip: bool) -> CheckReport | None:
    """Run the node checks; print failures; raise unless they all pass or ``force`` is set.
    Returns the report (its ``facts`` go into the lock); None when the preflight did not run."""
    if skip:
        click.echo("preflight: skipped (--skip-preflight)")
        return None
    if not launcher.nodes_known:
        click.echo(f"preflight: skipped for launcher {launcher.name} (the nodes are known only "
                   "once the job runs); run `epdctl check` inside an allocation to check them")
        return None
    report = _judged(run_check(topo, runners_for(topo, launcher), plan=plan), launcher)
    failed = [i for i in report.items if not i.ok]
    if not failed:
        click.echo(f"preflight: {len(report.items)} node checks passed")
        return report
    msg = (f"preflight: {len(failed)} of {len(report.items)} node checks failed:\n"
           + "\n".join(_line(i) for i in failed))
    lost = sorted({i.node for i in failed if i.check == "reach node"})
    if force and lost:  # --force runs past failed checks, never onto a node it cannot reach
        raise LaunchError(msg + f"\nnothing was started: --force cannot launch on {len(lost)} "
                          f"unreachable node(s) ({', '.join(lost)}); make them reachable (`epdctl "
                          "check TOPOLOGY`) or take them out of the topology")
    if force:
        click.secho(msg + "\n--force: launching anyway", fg="yellow", err=True)
        return report
    raise LaunchError(msg + "\nnothing was started; fix the above (details: `epdctl check "
                      "TOPOLOGY`), or launch anyway with --force, or skip it with "
                      "--skip-preflight")
