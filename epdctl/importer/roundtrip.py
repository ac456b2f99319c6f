"""Round trip: does ``render`` of an imported topology reproduce the input's server flags?

For every input server command (after migration to SGLang 0.5.23) and the rendered command of the
same worker and node rank: the share of the input's (flag, values) that come back identical, and
whether the multi-node wiring (``--dist-init-addr``, ``--nnodes``, ``--node-rank``) is the same.
Flags epdctl adds (``--enable-metrics``, ``--base-gpu-id 0``, ...) do not count against it; an input
flag that only restates the engine's default (``--nnodes 1``) matches when render leaves it out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from epdctl.importer.build import Draft
from epdctl.importer.launches import split_flags, vllm_common
from epdctl.errors import TopologyError
from epdctl.render import build_plan
from epdctl.topology import Topology, topology_from_text
from epdctl.engines import engine_of
from epdctl.topology.engine_flags import FlagTable

WIRING = ("--dist-init-addr", "--nnodes", "--node-rank")
REF = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")


@dataclass
class CommandResult:
    where: str
    spec: str
    total: int
    matched: int
    missing: list[str] = field(default_factory=list)
    wiring_ok: bool = True
    env_missing: list[str] = field(default_factory=list)  # NAME=value of the input the render lacks

    @property
    def ratio(self) -> float:
        return self.matched / self.total if self.total else 1.0


def _norm(v: str) -> str:
    return REF.sub(lambda m: "${" + m.group(1) + "}", v)


def _same(flag: str, want: list[str], got: list[str] | None, node_host: str, table: FlagTable) -> bool:
    if got is None:  # not rendered: the same only if the input asked for the engine's own default
        opt = table.resolve(flag)
        return bool(opt is not None and opt.takes_value and opt.default is not None and len(want) == 1
                    and str(opt.default) == want[0])
    want, got = [_norm(v) for v in want], [_norm(v) for v in got]
    if flag == "--host" and want and REF.fullmatch(want[0]):
        return got == [node_host]  # ${local_ip}: the node's own address
    if flag == "--encoder-urls":
        return sorted(want) == sorted(got)
    if flag == "--mem-fraction-static" and want and got:
        try:
            return float(want[0]) == float(got[0])
        except ValueError:
            return want == got
    return want == got


def load(text: str) -> tuple[Topology, list[str]]:
    """The imported topology and its cross-role problems (a partial set such as decode commands only
    still renders, so its flags can be compared)."""
    try:
        return topology_from_text(text), []
    except TopologyError as e:
        topo = topology_from_text(text, cross_checks=False)  # raises if the schema itself is wrong
        return topo, [p.format() for p in e.problems]


def compare(d: Draft, text: str) -> list[CommandResult]:
    """One result per input server command that has a rendered counterpart."""
    topo, _ = load(text)
    plan = build_plan(topo)
    specs = {s.name: s for s in plan.workers}
    engine = engine_of(topo)
    table = engine.flags()
    out: list[CommandResult] = []
    for name, launch in d.origin.items():
        spec = specs.get(name)
        want = [(f, v) for f, v in launch.flags]
        res = CommandResult(launch.cmd.where, name, len(want), 0)
        if spec is None:
            res.missing = [f for f, _ in want]
            out.append(res)
            continue
        skip = engine.command_prefix
        got: dict[str, list[str]] = {}
        rendered = split_flags(list(spec.argv[skip:]), engine.flags(None, spec.argv[skip - 1]) if skip else table)
        if engine.imports.common_names:
            rendered = vllm_common([("--model", [spec.argv[2]])] + rendered)
        for f, v in rendered:
            got.setdefault(f, []).extend(v)
        for k, val in {**launch.cmd.exported, **launch.cmd.env}.items():
            if spec.env.get(k) != val and not (spec.env.get(k) == "${" + k + "}"):  # secrets become references
                res.env_missing.append(f"{k}={val}")
        for f, v in want:
            if _same(f, v, got.get(f), topo.node(spec.node).host, table):
                res.matched += 1
            else:
                res.missing.append(f"{f} {' '.join(v)}".strip() + f" (rendered: {' '.join(got.get(f, ['-']))})")
                if f in WIRING:
                    res.wiring_ok = False
        out.append(res)
    return out


def summary(results: list[CommandResult]) -> tuple[int, int, bool]:
    """(flags matched, flags total, wiring identical everywhere)."""
    return (sum(r.matched for r in results), sum(r.total for r in results), all(r.wiring_ok for r in results))
