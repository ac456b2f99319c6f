"""Plan -> a ready-to-submit sbatch script. Pure and deterministic (golden-tested).

Why host substitution: a topology names its nodes with addresses (10.1.0.10, or placeholders
such as ``n0.slurm``), but under SLURM the scheduler picks the machines. Every occurrence of a
topology node's address in a worker's command (bind host, peer URLs, ``--dist-init-addr``) is
rewritten to ``${EPD_ADDR_<i>}``, which the script sets from the allocation's i-th node at run
time, so one script runs on whatever nodes the scheduler grants.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import jinja2

from epdctl.errors import RenderError
from epdctl.orchestrate.startup import budgets
from epdctl.render.output import comment_safe, shell_quote
from epdctl.render.plan import Plan, ProcessSpec, placed
from epdctl.topology.model import ROLE_ORDER, Topology

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "sbatch.sh.j2"
STAGES = tuple(r.value for r in ROLE_ORDER)
PYTHONS = ("python", "python3")


@dataclass(frozen=True)
class SbatchStep:
    """One worker (or the router) as the script starts it."""

    name: str
    role: str
    node: str
    node_index: int
    node_rank: int
    nnodes: int
    is_leader: bool
    command: str          # shell text run by `bash -c` inside the step (expands ${EPD_ADDR_i})
    health_url: str       # quoted NAME=URL argument for wait_ready, "" for liveness-only ranks
    url: str              # URL with ${EPD_ADDR_i} references
    options: tuple[str, ...] = ()  # srun options of the step: its container (pyxis, SLURM OCI)


def slurm_nodes(topo: Topology, plan: Plan) -> list[str]:
    """Topology nodes that run something, in declaration order: allocation node i is entry i."""
    used = set(plan.nodes)
    return [n.name for n in topo.nodes if n.name in used]


def host_map(topo: Topology, nodes: list[str]) -> dict[str, str]:
    """Topology address -> ``${EPD_ADDR_i}``; addresses must be unique to be replaceable."""
    seen: dict[str, str] = {}
    for i, name in enumerate(nodes):
        host = topo.node(name).host
        if host in seen:
            raise RenderError(
                f"nodes {seen[host]!r} and {name!r} share the address {host!r}; under SLURM each node's address "
                f"is replaced by the allocated node's, so give every node its own host (placeholders such as "
                f"n0.slurm, n1.slurm are fine)")
        seen[host] = name
    return {topo.node(name).host: "${EPD_ADDR_%d}" % i for i, name in enumerate(nodes)}


def substitute(text: str, hosts: dict[str, str]) -> str:
    """Replace whole-address occurrences (not 10.1.0.1 inside 10.1.0.10)."""
    for host in sorted(hosts, key=len, reverse=True):
        new = hosts[host]
        text = re.sub(r"(?<![\w.-])" + re.escape(host) + r"(?![\w-]|\.\w)", lambda _m: new, text)
    return text


def step_command(argv: Sequence[str], setup: Sequence[str], *, plan_python: str, python: str | None,
                 env: Mapping[str, str] | None = None, prefix: Sequence[str] = ()) -> str:
    """The shell text one job step runs (``bash -c``), for the sbatch script and for the SLURM
    launcher alike: the node's setup lines, then ``exec`` of ``prefix`` (the supervisor) + the
    planned command, with ``python`` in place of the plan's interpreter (``plan_python``, or a
    bare python/python3; None: keep it) and ``env`` set inline."""
    args = list(argv)
    if python is not None and args and args[0] in (*PYTHONS, plan_python):
        args[0] = python
    envs = [f"{k}={shell_quote(v)}" for k, v in sorted((env or {}).items())]
    words: list[str] = [shell_quote(a) for a in prefix]
    for a in args:
        q = shell_quote(a)
        if a.startswith("-") and a != "-m" and words:
            words.append("\\\n    " + q)  # one flag per line, as `epdctl render` prints them
        else:
            words.append(q)
    head = "exec " + ("env " + " ".join(envs) + " \\\n    " if envs else "")
    lines = list(setup) + [head + " ".join(words)]
    return "\n".join(lines)


def _step(spec: ProcessSpec, *, topo: Topology, nodes: list[str], hosts: dict[str, str]) -> SbatchStep:
    """One process of the script: its addresses become the allocated nodes' ``${EPD_ADDR_i}``."""
    at = placed(spec, lambda text: substitute(text, hosts))
    health = f"{at.url}{at.health_path}" if at.is_leader else ""
    return SbatchStep(name=at.name, role=at.role.value, node=at.node, node_index=nodes.index(at.node),
                      node_rank=at.node_rank, nnodes=at.nnodes, is_leader=at.is_leader,
                      command=step_command(at.argv, at.setup, plan_python=topo.python,
                                           python=None if at.container is not None else "${EPDCTL_PYTHON}",
                                           env=at.env),
                      options=at.step_options,
                      health_url=shell_quote(f"{at.name}={health}") if health else "", url=at.url)


def steps(topo: Topology, plan: Plan) -> list[tuple[str, list[SbatchStep]]]:
    """(stage, steps) in start order: each role waits for the previous one, the router comes last."""
    nodes = slurm_nodes(topo, plan)
    hosts = host_map(topo, nodes)
    out: list[tuple[str, list[SbatchStep]]] = []
    for stage in STAGES:
        group = [_step(w, topo=topo, nodes=nodes, hosts=hosts) for w in plan.workers if w.role == stage]
        if group:
            out.append((stage, group))
    if plan.router is not None:
        out.append(("router", [_step(plan.router, topo=topo, nodes=nodes, hosts=hosts)]))
    return out


def directives(topo: Topology, nodes: int, job_name: str | None = None, output: str | None = None,
               max_gpus: int = 0) -> list[tuple[str, str]]:
    """#SBATCH options in a fixed order, every value shell-quoted; ``extra`` last, sorted.

    GPUs per node: ``slurm.gpus_per_node``, else the most GPUs any used topology node declares.
    """
    s = topo.slurm
    gpus = s.gpus_per_node if s is not None and s.gpus_per_node is not None else max_gpus
    out: list[tuple[str, Any]] = [("job-name", job_name or f"epd-{topo.name}"), ("nodes", nodes),
                                  ("ntasks-per-node", 1), ("gpus-per-node", gpus)]
    if s is not None:
        out += [("partition", s.partition), ("account", s.account), ("qos", s.qos), ("constraint", s.constraint),
                ("time", s.time)]
    out.append(("output", output or f"epd-{topo.name}-%j.out"))
    if s is not None:
        out += sorted(s.extra.items())
    return [(k, "" if v == "" else shlex.quote(str(v))) for k, v in out if v is not None and v != 0]


def description(topo: Topology) -> list[str]:
    """The topology file's leading comment block: what this deployment is, for the script header."""
    if topo.source is None:
        return []
    try:
        lines = topo.source.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        if not line.startswith("#"):
            break
        if not line.startswith("# yaml-language-server:"):  # an editor directive, not a description
            out.append(line)
    return out


def stage_timeouts(stages: Sequence[tuple[str, Sequence[SbatchStep]]],
                   limits: Mapping[str, float]) -> dict[str, int]:
    """Seconds the script waits for each stage: the largest start-up budget of its processes
    (``limits``, epdctl/orchestrate/startup.py), rounded up."""
    return {stage: math.ceil(max(limits[w.name] for w in group)) for stage, group in stages}


def render_sbatch(topo: Topology, plan: Plan, template: Path | None = None, *, job_name: str | None = None,
                  output: str | None = None, limits: Mapping[str, float] | None = None) -> str:
    """The sbatch script for ``plan`` (``template`` overrides templates/sbatch.sh.j2). Each stage
    waits for its processes as long as their start-up budgets allow (``limits``, by process name;
    default: `budgets`, as `up` uses)."""
    path = template or TEMPLATE
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RenderError(f"cannot read sbatch template {path}: {e.strerror}") from e
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True,
                             lstrip_blocks=True, autoescape=False,
                             comment_start_string="{#!", comment_end_string="!#}")  # bash uses ${#x[@]}
    env.filters["q"] = shell_quote
    env.filters["c"] = comment_safe
    nodes = slurm_nodes(topo, plan)
    ordered = steps(topo, plan)
    waits = stage_timeouts(ordered, budgets(topo, plan) if limits is None else limits)
    try:
        return env.from_string(text).render(
            name=topo.name, engine=topo.engine, source=topo.source.name if topo.source else "",
            python=topo.python, ready_timeout=max(waits.values(), default=0), description=description(topo),
            directives=directives(topo, len(nodes), job_name, output,
                                  max((topo.node(n).gpus for n in nodes), default=0)),
            nodes=[{"name": n, "index": i} for i, n in enumerate(nodes)],
            stages=[{"name": stage, "workers": group, "timeout": waits[stage]} for stage, group in ordered])
    except jinja2.TemplateError as e:
        raise RenderError(f"sbatch template {path}: {e}") from e
