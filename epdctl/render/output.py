"""Plan -> text: paste-safe shell (every value quoted; ``${NAME}`` references kept as "${NAME}")
or JSON (the plan as data)."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any
from importlib import resources

import jinja2

from epdctl.render.plan import Plan, ProcessSpec

_REF = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}")


def shell_quote(value: str) -> str:
    """shlex.quote, except that ``${NAME}`` references stay expandable: ``"${NAME}"``."""
    if not _REF.search(value):
        return shlex.quote(value)
    out, pos = [], 0
    for m in _REF.finditer(value):
        out.append(_dq_escape(value[pos:m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(_dq_escape(value[pos:]))
    return '"' + "".join(out) + '"'


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


def comment_safe(value: object) -> str:
    """Text for a ``#`` comment line: anything that could end the line (or not encode) becomes '?'."""
    return _UNPRINTABLE.sub("?", str(value))


def _dq_escape(text: str) -> str:
    return re.sub(r'([\\"`$])', r"\\\1", text)


def _command(argv: tuple[str, ...], env: dict[str, str]) -> str:
    """One command: ``env K=V ... argv``, continued over lines at each flag."""
    parts = [f"{k}={shell_quote(v)}" for k, v in sorted(env.items())]
    head = ("env " + " ".join(parts) + " \\\n  ") if parts else ""
    words: list[str] = []
    for tok in argv:
        q = shell_quote(tok)
        if tok.startswith("--") and words:
            words.append(" \\\n    " + q)
        else:
            words.append((" " if words else "") + q)
    return head + "".join(words)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FunctionLoader(_template), undefined=jinja2.StrictUndefined,
                             autoescape=False, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["q"] = shell_quote
    env.filters["c"] = comment_safe
    # a container step (pyxis, SLURM OCI) is the srun that puts the command into its container
    env.filters["command"] = lambda spec: _command(
        ("srun", *spec.step_options, *spec.argv) if spec.step_options else spec.argv, spec.env)
    return env


def _template(name: str) -> str:
    return resources.files("epdctl").joinpath("templates", name).read_text(encoding="utf-8")


def to_shell(plan: Plan, node: str | None = None) -> str:
    """The commands each node runs, in start order (router last)."""
    nodes = [node] if node else [n for n in plan.nodes if plan.for_node(n)]
    sections: list[dict[str, Any]] = [{"node": n, "workers": plan.for_node(n), "router": None, "setup": plan.setup.get(n, ())}
                for n in nodes]
    if plan.router is not None and (node is None or node == plan.router.node):
        if node is None:  # whole plan: the router starts last, after every node's workers
            sections.append({"node": plan.router.node, "workers": [], "router": plan.router, "setup": ()})
        else:
            sections[0]["router"] = plan.router
    return _environment().get_template("plan.sh.j2").render(plan=plan, sections=sections)


def plan_dict(plan: Plan, node: str | None = None) -> dict[str, object]:
    """The plan as JSON-ready data (optionally one node's part)."""
    workers = [_worker_dict(w) for w in plan.workers if node is None or w.node == node]
    router = _router_dict(plan.router) if plan.router and (node is None or plan.router.node == node) else None
    setup = {k: list(v) for k, v in plan.setup.items() if node is None or k == node}
    return {"name": plan.name, "engine": plan.engine, "workers": workers, "router": router, "setup": setup}


def _worker_dict(w: ProcessSpec) -> dict[str, object]:
    return {**_container_dict(w), "name": w.name, "role": w.role.value, "node": w.node, "host": w.host, "port": w.port,
            "bootstrap_port": w.bootstrap_port, "encoder_bootstrap_port": w.encoder_bootstrap_port,
            "node_rank": w.node_rank, "nnodes": w.nnodes, "argv": list(w.argv), "env": dict(w.env), "url": w.url,
            "health_path": w.health_path, "is_leader": w.is_leader, "gpus": list(w.gpus)}


def _container_dict(w: ProcessSpec) -> dict[str, object]:
    """The container a worker runs in (absent for a bare worker)."""
    if w.container is None:
        return {}
    out: dict[str, object] = {"container": {"runtime": w.container.runtime, "image": w.container.image,
                                            "name": w.container_name}}
    return {**out, "step_options": list(w.step_options)} if w.step_options else out


def _router_dict(r: ProcessSpec) -> dict[str, object]:
    return {"node": r.node, "host": r.host, "port": r.port, "prometheus_port": r.prometheus_port,
            "argv": list(r.argv), "env": dict(r.env), "url": r.url, "api_key_env": r.api_key_env,
            "health_path": r.health_path}


def to_json(plan: Plan, node: str | None = None) -> str:
    return json.dumps(plan_dict(plan, node), indent=2, sort_keys=False) + "\n"
