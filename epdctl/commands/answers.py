"""The answer check's two entry points: `up` (the topology's ``check:`` block, after the canary,
before it reports ready) and `epdctl check --answers FILE CLUSTER` (any time)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from epdctl.answers.ask import AnswerReport, ask_all, render
from epdctl.answers.questions import load
from epdctl.errors import EpdctlError, Reported
from epdctl.state.store import resolve_cluster

from epdctl.commands.args import cluster_arg


def _still(name: str) -> str:
    return (f"the cluster is left running for inspection (`epdctl status {name}`, `epdctl logs`); "
            f"stop it with `epdctl down {name}`")


def _show(report: AnswerReport, source: Any) -> None:
    lines = render(report, source)
    click.secho(lines[0], fg="green" if report.passed else "red")
    for ln in lines[1:]:
        click.echo(ln)


def run_up_answers(router_url: str, topo: Any, api_key_env: str | None) -> None:
    """`up`: ask the topology's answers file; exit 1 (cluster left up) when too few are right."""
    chk = topo.check
    questions = load(chk.answers)
    report = ask_all(router_url, questions, model=topo.model.served_name, api_key_env=api_key_env,
                     min_correct=chk.min_correct)
    _show(report, chk.answers)
    if not report.passed:
        click.echo(_still(topo.name), err=True)
        raise Reported()


def check_answers(answers: Path, cluster: str | None, min_correct: float | None) -> None:
    """`epdctl check --answers FILE CLUSTER`: the same check on a running cluster."""
    questions = load(answers)
    cdir = resolve_cluster(cluster_arg(cluster))
    state = cdir.load()
    if state is None:
        raise EpdctlError(f"cluster {cdir.name!r} is not running (no recorded state)")
    if state.router is None:
        raise EpdctlError(f"cluster {state.name!r} has no router to ask")
    least = 1.0 if min_correct is None else min_correct
    report = ask_all(state.router.url, questions, model=state.model, api_key_env=state.api_key_env,
                     min_correct=least)
    _show(report, answers)
    if not report.passed:
        raise Reported()
