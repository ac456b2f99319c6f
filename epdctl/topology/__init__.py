"""Topology files: YAML -> frozen records, layered defaults, validation with paths and lines.

``load_topology(path)`` reads, checks everything and raises ``TopologyError`` listing every
problem (sorted by line); on success the returned ``Topology`` is safe to render.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from epdctl.engines.registry import ENGINE_NAMES, UnknownDevice, UnknownEngine, engine_for
from epdctl.errors import Problem, TopologyError
from epdctl.launchers.kinds import allocates_nodes
from epdctl.topology.answers import read_check
from epdctl.topology.allocation import counted_roles, synthesize
from epdctl.topology.checks import run_checks
from epdctl.topology.container import missing_artifacts, read_layer
from epdctl.topology.limits import read_limits
from epdctl.topology.loader import Document, load_document, parse_yaml
from epdctl.topology.model_source import resolve as resolve_model
from epdctl.topology.model import ROLE_ORDER, Model, Node, Role, Settings, Topology, Worker
from epdctl.topology.placement import read_roles
from epdctl.topology.reader import Reader
from epdctl.topology.safety import unsafe_text, unsafe_values
from epdctl.topology.restart import read_restart
from epdctl.topology.schema import (ENGINES, LAUNCHERS, SETTING_KEYS, read_model, read_nodes, read_settings,
                                   read_startup, top_level)
from epdctl.topology.sections import read_engine, read_in_place, read_ports, read_router, read_slurm, read_transfer

__all__ = ["load_topology", "require_artifacts", "topology_from_text", "Topology", "Worker", "Node", "Role", "Settings", "ROLE_ORDER"]


def load_topology(path: str | Path) -> Topology:
    """Read and validate a topology file; raise TopologyError with all problems."""
    return _build(load_document(path))


def require_artifacts(topo: Topology, path: str | Path) -> None:
    """Raise TopologyError, with YAML lines, for container artefacts ``topo`` needs that are not
    there (`missing_artifacts`); ``path`` is the file ``topo`` was read from."""
    found = missing_artifacts(topo)
    if found:
        doc = load_document(path)
        raise TopologyError(_sorted([Problem(where, doc.line(where), msg) for where, msg in found]))


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
    engine, engine_version, engine_venv, engine_python, engine_device = read_engine(r, top, ENGINES)
    if engine is not None and engine in ENGINE_NAMES and (engine_version is not None or engine_device is not None):
        try:
            engine_for(engine, engine_version, engine_device)
        except UnknownDevice as e:
            r.problem("engine.device", str(e))
            engine_device = None
        except UnknownEngine as e:
            r.problem("engine.version", f"{e}; name one of these or leave version out for the default")
            engine_version = None
    launcher = r.get(top, "", "launcher", "str", default="local", choices=LAUNCHERS)
    python = _resolve_python(r.get(top, "", "python", "str", default="python3"), doc.source)
    model = read_model(r, top)
    defaults: dict = {}
    if top.get("defaults") is not None:
        d = r.mapping(top["defaults"], "defaults", SETTING_KEYS, "defaults")
        if d is not None:
            defaults = read_settings(r, d, "defaults", SETTING_KEYS)
    if top.get("startup") is not None:  # top-level `startup:`: below `defaults`
        top_startup = read_startup(r, top["startup"], "startup")
        if top_startup is not None:
            defaults = {"startup_timeout": top_startup, **defaults}
    if top.get("container") is not None:  # the lowest layer: under defaults.container
        defaults["container"] = [read_layer(r, top["container"], "container"), *defaults.get("container", [])]
    slurm = read_slurm(r, top)
    nodes, node_layers = read_nodes(r, top, required=not counted_roles(top))
    counted, counted_layers, role_nodes = synthesize(r, top, launcher, slurm, {n.name for n in nodes})
    nodes, node_layers = nodes + counted, {**node_layers, **counted_layers}
    uses_gpus = _uses_gpus(engine, engine_version, engine_device)
    workers = read_roles(r, top, {n.name: n for n in nodes}, node_layers, defaults, uses_gpus, role_nodes)
    transfer = read_transfer(r, top)
    router = read_router(r, top)
    ports = read_ports(r, top)
    in_place = read_in_place(r, top)
    limits = read_limits(r, top)
    restart = read_restart(r, top)
    answer_check = read_check(r, top, doc.source)
    if allocates_nodes(launcher) and slurm is None and "slurm" not in top:
        r.problem("launcher", "launcher slurm needs a slurm section (partition, account, time, gpus_per_node)")
    if model is None or name is None or engine is None:
        raise TopologyError(_sorted(r.problems))
    model = _resolve_model(model, doc.source)
    engine_venv, engine_python = _beside(engine_venv, doc.source), _beside(engine_python, doc.source)
    topo = Topology(name=name, model=model, engine=engine, launcher=launcher, nodes=nodes, workers=workers,
                    transfer=transfer, router=router, slurm=slurm, ports=ports, python=python, in_place=in_place,
                    engine_version=engine_version, engine_venv=engine_venv, engine_python=engine_python,
                    engine_device=engine_device, limits=limits, restart=restart, check=answer_check,
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
    """Resolve relative folders against the topology file (``model_source.resolve``); read the
    architecture from the weights' config.json where it can be read here."""
    model = resolve_model(model, source.resolve().parent if source is not None else None)
    arch = model.architecture
    if arch is None:
        try:
            cfg = json.loads((Path(model.origin) / "config.json").read_text(encoding="utf-8"))
            archs = cfg.get("architectures") if isinstance(cfg, dict) else None
            if isinstance(archs, list) and archs and isinstance(archs[0], str):
                arch = archs[0]
        except (OSError, ValueError):
            arch = None  # not here (a hub id not yet downloaded, a node's own folder): the engine reads it
    return dataclasses.replace(model, architecture=arch)


def _uses_gpus(engine: str | None, version: str | None, device: str | None) -> bool:
    if engine is None or engine not in ENGINE_NAMES:
        return True
    try:
        return engine_for(engine, version, device).uses_gpus
    except UnknownEngine:  # already reported at engine.version / engine.device
        return True


def _beside(path: str | None, source: Path | None) -> str | None:
    """A ``./`` or ``../`` path resolved against the topology file (a checkout's own engine venv)."""
    if path is None or source is None or not path.startswith(("./", "../")):
        return path
    return str((source.resolve().parent / path).resolve())


def _resolve_python(python: str, source: Path | None) -> str:
    """A ``./`` or ``../`` interpreter path is relative to the topology file (a project venv)."""
    if source is not None and python.startswith(("./", "../")):
        return os.path.normpath(source.resolve().parent / python)  # the venv's link, not its target
    return python


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
