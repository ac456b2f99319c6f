"""Topology files: YAML -> frozen records, layered defaults, validation with paths and lines.

``load_topology(path)`` reads, checks everything and raises ``TopologyError`` listing every
problem (sorted by line); on success the returned ``Topology`` is safe to render.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from epdctl.errors import Problem, TopologyError
from epdctl.topology.allocation import counted_roles, synthesize
from epdctl.topology.checks import run_checks
from epdctl.topology.limits import read_limits
from epdctl.topology.loader import Document, load_document, parse_yaml
from epdctl.topology.model import ROLE_ORDER, Model, Node, Role, Settings, Topology, Worker
from epdctl.topology.placement import read_roles
from epdctl.topology.reader import Reader
from epdctl.topology.safety import unsafe_text, unsafe_values
from epdctl.topology.restart import read_restart
from epdctl.topology.schema import ENGINES, LAUNCHERS, SETTING_KEYS, read_model, read_nodes, read_settings, top_level
from epdctl.topology.sections import read_in_place, read_ports, read_router, read_slurm, read_transfer

__all__ = ["load_topology", "topology_from_text", "Topology", "Worker", "Node", "Role", "Settings", "ROLE_ORDER"]


def load_topology(path: str | Path) -> Topology:
    """Read and validate a topology file; raise TopologyError with all problems."""
    return _build(load_document(path))


def topology_from_text(text: str, source: str | Path | None = None, *, cross_checks: bool = True) -> Topology:
    """Same as load_topology for text already in memory (``source`` anchors relative paths).
    ``cross_checks=False`` skips the cross-role checks (a partial set, e.g. decode commands only)."""
    return _build(parse_yaml(text, Path(source) if source else None), cross_checks)


def _build(doc: Document, cross_checks: bool = True, reader: Reader | None = None) -> Topology:
    tracing = reader is not None  # jsonschema_gen: placeholder values, no text to scan
    unsafe = [] if tracing else [Problem(path, doc.line(path), msg) for path, msg in unsafe_text(doc.data)]
    if unsafe:  # nothing else reads a document holding control characters or lone surrogates
        raise TopologyError(_sorted(_dedupe(unsafe)))
    r = reader or Reader(doc)  # jsonschema_gen passes a tracing reader
    top = top_level(r, doc)
    if top is None:
        raise TopologyError(r.problems)
    for path, msg in [] if tracing else unsafe_values(top):
        r.problem(path, msg)
    name = r.get(top, "", "name", "str", required=True)
    engine = r.get(top, "", "engine", "str", required=True, choices=ENGINES)
    launcher = r.get(top, "", "launcher", "str", default="local", choices=LAUNCHERS)
    python = r.get(top, "", "python", "str", default="python3")
    model = read_model(r, top)
    defaults: dict = {}
    if top.get("defaults") is not None:
        d = r.mapping(top["defaults"], "defaults", SETTING_KEYS, "defaults")
        if d is not None:
            defaults = read_settings(r, d, "defaults", SETTING_KEYS)
    slurm = read_slurm(r, top)
    nodes, node_layers = read_nodes(r, top, required=not counted_roles(top))
    counted, counted_layers, role_nodes = synthesize(r, top, launcher, slurm, {n.name for n in nodes})
    nodes, node_layers = nodes + counted, {**node_layers, **counted_layers}
    workers = read_roles(r, top, {n.name: n for n in nodes}, node_layers, defaults, engine, role_nodes)
    transfer = read_transfer(r, top)
    router = read_router(r, top)
    ports = read_ports(r, top)
    in_place = read_in_place(r, top)
    limits = read_limits(r, top)
    restart = read_restart(r, top)
    if launcher == "slurm" and slurm is None and "slurm" not in top:
        r.problem("launcher", "launcher slurm needs a slurm section (partition, account, time, gpus_per_node)")
    if model is None or name is None or engine is None:
        raise TopologyError(_sorted(r.problems))
    model = _resolve_model(model, doc.source)
    topo = Topology(name=name, model=model, engine=engine, launcher=launcher, nodes=nodes, workers=workers,
                    transfer=transfer, router=router, slurm=slurm, ports=ports, python=python, in_place=in_place,
                    limits=limits, restart=restart,
                    source=doc.source,
                    lines=doc.lines)
    problems = list(r.problems)
    if not cross_checks:
        if problems:
            raise TopologyError(_sorted(problems))
        return topo
    try:  # all problems in one run: the cross-role checks also run on what did read
        problems += [Problem(path, doc.line(path), msg) for path, msg in run_checks(topo)]
    except Exception:  # noqa: BLE001 - a partial topology may trip a check; its reader problems stand
        if not r.problems:
            raise
    if problems:
        raise TopologyError(_sorted(_dedupe(problems)))
    return topo


def _resolve_model(model: Model, source: Path | None) -> Model:
    """Resolve ``./`` and ``../`` model paths against the topology file; read the architecture."""
    path = model.path
    if source is not None and (path.startswith("./") or path.startswith("../") or path in (".", "..")):
        path = str((source.resolve().parent / path).resolve())
    arch = model.architecture
    if arch is None:
        try:
            cfg = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
            archs = cfg.get("architectures") if isinstance(cfg, dict) else None
            if isinstance(archs, list) and archs and isinstance(archs[0], str):
                arch = archs[0]
        except (OSError, ValueError):
            arch = None  # not a local checkout (e.g. a hub id): the engine will read it at start
    served = path if model.served_name == model.path else model.served_name  # default: the path SGLang gets
    return dataclasses.replace(model, path=path, architecture=arch, served_name=served)


def _dedupe(problems: list[Problem]) -> list[Problem]:
    seen, out = set(), []
    for p in problems:
        key = (p.path, p.message)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def _sorted(problems: list[Problem]) -> list[Problem]:
    return sorted(problems, key=lambda p: (p.line if p.line is not None else 0, p.path))
