"""`epdctl check TOPOLOGY`: preflight every node (and with --links, every transfer link)
before `up`, so a dead port or a slow rail is found in seconds rather than as a hung transfer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from epdctl.errors import EpdctlError, Reported
from epdctl.preflight import links as links_mod
from epdctl.preflight.run import CheckReport, run_check
from epdctl.preflight.targets import runners_for, transport_of


def _load(path: str) -> tuple[Any, Any]:
    try:
        from epdctl.topology import load_topology
    except ImportError as e:
        raise EpdctlError(f"cannot load topologies in this install ({e})") from None
    topo = load_topology(Path(path))
    try:
        from epdctl.render import build_plan
    except ImportError:
        return topo, None
    return topo, build_plan(topo)


def _fmt(v: float | None, spec: str = ".3g") -> str:
    return "-" if v is None else format(v, spec)


def _label(report: CheckReport, i: Any) -> str:
    if report.failed(i):
        return "FAIL" if i.status == "fail" else "FAIL(strict)"
    return "WARN" if i.status == "warn" else "ok"


def render_table(report: CheckReport, transport: str, threshold: float) -> str:
    """The human view: node checks, then the link matrix; failures carry their reason."""
    rows = [("NODE", "CHECK", "RESULT", "DETAIL")]
    rows += [(i.node, i.check, _label(report, i), i.detail) for i in report.items]
    w = [max(len(r[k]) for r in rows) for k in range(3)]
    lines = ["  ".join(r[k].ljust(w[k]) for k in range(3)) + "  " + r[3] for r in rows]
    if report.links_checked:
        lines += ["", f"LINKS ({transport}, pass at {threshold:.0%} of the slower NIC's line rate)"]
        lrows = [("PAIR", "CARRIES", "RAIL", "NICS", "GBIT/S", "LINE", "RTT MS", "RESULT")]
        reasons = []
        for r in report.links:
            p = r.pair
            lrows.append((p.label, ",".join(p.kinds), str(p.rail),
                          f"{p.src.nic}({p.src.ip})->{p.dst.nic}({p.dst.ip})", _fmt(r.gbps),
                          _fmt(r.line_gbps, "g"), _fmt(r.rtt_ms), "ok" if r.ok else "FAIL"))
            reasons.append(r.reason or "")
        if len(lrows) == 1:
            lines.append("no node pairs carry transfers (every role shares one node)")
        else:
            lw = [max(len(r[k]) for r in lrows) for k in range(len(lrows[0]))]
            for row, why in zip(lrows, [""] + reasons):
                text = "  ".join(row[k].ljust(lw[k]) for k in range(len(row))).rstrip()
                lines.append(text + (f"  {why}" if why else ""))
    failed = sum(report.failed(i) for i in report.items) + sum(not r.ok for r in report.links)
    warned = sum(i.status == "warn" for i in report.items)
    tail = "all checks passed" if not failed else f"{failed} check(s) failed"
    lines += ["", tail + (f", {warned} warning(s)" if warned else "")
              + (" (--strict: warnings fail)" if report.strict and warned else "")]
    return "\n".join(lines)


@click.command("check")
@click.argument("topology", required=False)
@click.option("--canary", "canary", is_flag=True,
              help="On a running cluster (TOPOLOGY is then a cluster name or topology file, "
                   "optional when one cluster is recorded): send requests to every "
                   "encoder->prefill and prefill->decode pair and check bytes moved.")
@click.option("--links", "with_links", is_flag=True,
              help="Also measure every transfer link (encoder->prefill, prefill->decode, PP).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option("--threshold", type=click.FloatRange(0.0, 1.0, min_open=True),
              default=links_mod.DEFAULT_THRESHOLD, show_default=True,
              help="A link passes at this fraction of the slower NIC's declared speed.")
@click.option("--seconds", type=click.FloatRange(0.05, 60.0), default=0.5, show_default=True,
              help="Bandwidth measurement time per link.")
@click.option("--agent-port", type=click.IntRange(1024, 65000),
              default=links_mod.DEFAULT_AGENT_PORT, show_default=True,
              help="First port the link agents listen on (one per receiving NIC).")
@click.option("--min-disk-gb", type=float, default=1.0, show_default=True,
              help="Free space required on the model's filesystem.")
@click.option("--strict", is_flag=True,
              help="Warnings (no subnet manager, MTU below max, mixed rail rates, ...) fail too.")
@click.option("--answers", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="On a running cluster (TOPOLOGY is then a cluster name or topology file): ask "
                   "this JSONL file's questions through the router and judge the answers "
                   "(prompt or messages; expect or expect_regex).")
@click.option("--min-correct", type=click.FloatRange(0.0, 1.0, min_open=True), default=None,
              help="With --answers: the share of answers that must be right (default 1).")
def check(topology: str | None, canary: bool, with_links: bool, as_json: bool, threshold: float,
          seconds: float, agent_port: int, min_disk_gb: float, strict: bool,
          answers: Path | None, min_correct: float | None) -> None:
    """Preflight TOPOLOGY's nodes: RDMA ports, GPUs, limits, versions, ports; exit 1 on failure
    (ok / WARN / FAIL per item; see `epdctl diagnose` for one saved tool output).

    With --canary, check a running cluster's transfers pair by pair instead.
    """
    if answers is not None:
        from epdctl.commands.answers import check_answers

        check_answers(answers, topology, min_correct)
        return
    if canary:
        from epdctl.commands.canary import check_canary

        check_canary(topology, as_json)
        return
    if topology is None:
        raise click.UsageError("missing argument TOPOLOGY (a topology file; with --canary, "
                               "a running cluster)")
    if not Path(topology).is_file():
        hint = "" if topology.endswith((".yaml", ".yml")) else (
            f" (to check the transfers of running cluster {topology!r}: "
            f"`epdctl check --canary {topology}`)")
        raise EpdctlError(f"topology file {topology} not found{hint}")
    topo, plan = _load(topology)
    report = run_check(topo, runners_for(topo), plan=plan, links=with_links,
                       threshold=threshold, seconds=seconds, agent_port=agent_port,
                       min_disk_gb=min_disk_gb, strict=strict)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        click.echo(render_table(report, transport_of(topo), threshold))
    if not report.ok:
        raise Reported()
