"""`epdctl check --canary [CLUSTER]`: every transfer pair of a running cluster, by its bytes.

Why a separate command path: the preflight judges a topology before launch; this one talks to
the recorded workers of a running cluster (resolved as `epdctl status` resolves it).
"""

from __future__ import annotations

import json
import sys

import click

from epdctl.commands.canary_view import render_pairs
from epdctl.commands.cluster import _cluster_arg
from epdctl.errors import EpdctlError
from epdctl.pair_canary import run_pair_canary
from epdctl.state import resolve_cluster


def check_canary(cluster: str | None, as_json: bool) -> None:
    cdir = resolve_cluster(_cluster_arg(cluster))
    state = cdir.load()
    if state is None:
        raise EpdctlError(f"cluster {cdir.name!r} is not running (nothing recorded); start it "
                          "with `epdctl up TOPOLOGY`")
    workers = [p for p in state.processes if p.role != "router"]
    report = run_pair_canary(workers, model=state.model)
    if as_json:
        click.echo(json.dumps({"cluster": state.name, **report.to_json()}, indent=2))
    else:
        click.echo(render_pairs(report, state.name))
    if not report.ok:
        sys.exit(1)
