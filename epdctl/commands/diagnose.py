"""`epdctl diagnose FILE... [--json]`: judge saved outputs of the RDMA/GPU diagnostic tools offline
(what an engineer pastes from a node they cannot reach, or from a support ticket)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from epdctl.errors import Reported
from epdctl.preflight.diagnose import judge_file
from epdctl.preflight.judgement import FAIL, Judgement


def render(path: str, j: Judgement) -> str:
    lines = [f"{path}: {j.tool} -> {j.verdict.upper()}"]
    facts = {k: v for k, v in j.facts.items() if k not in ("gids", "ports", "links", "gpus")}
    if "ports" in j.facts:
        for p in j.facts["ports"]:
            rate = f" {p['rate_gbps']:g} Gb/s" if p.get("rate_gbps") else ""
            mtu = f" mtu {p['active_mtu']}/{p['max_mtu']}" if p.get("active_mtu") else ""
            lines.append(f"  port {p['device']}/{p['port']}: {p['state'] or '?'}"
                         f"{' (' + p['phys_state'] + ')' if p['phys_state'] else ''}"
                         f" {p['link_layer']}{rate}{mtu}".rstrip())
    if "links" in j.facts:
        lines += [f"  {n['device']} -> {n['netdev']} {'Up' if n['up'] else 'Down'}"
                  f"{' (VF)' if n['vf'] else ''}" for n in j.facts["links"]]
    if "gpus" in j.facts:
        for g in j.facts["gpus"]:
            lines.append("  gpu " + ", ".join(f"{k}={v}" for k, v in g.items()))
    if facts:
        lines.append("  facts: " + ", ".join(f"{k}={v}" for k, v in facts.items()))
    for f in j.findings:
        lines.append(f"  [{f.level}] {f.message}")
        if f.advice and f.level != "pass":
            lines.append(f"         -> {f.advice}")
    return "\n".join(lines)


@click.command("diagnose")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def diagnose(files: tuple[str, ...], as_json: bool) -> None:
    """Judge saved outputs of ibv_devinfo, ibstat, ibstatus, ibdev2netdev, show_gids, perftest,
    nvidia-smi, lsmod, ulimit -l and Mooncake logs; the tool is recognised by content.

    Exit 0 when nothing fails, 1 otherwise.
    """
    results = [(f, judge_file(Path(f))) for f in files]
    if as_json:
        doc = {"files": [{"file": f, **j.to_json()} for f, j in results]}
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo("\n\n".join(render(f, j) for f, j in results))
        failed = sum(j.verdict == FAIL for _, j in results)
        click.echo(f"\n{len(results)} file(s): {failed} fail, "
                   f"{sum(j.verdict == 'warn' for _, j in results)} warn")
    if any(j.verdict == FAIL for _, j in results):
        raise Reported()
