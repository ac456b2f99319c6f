"""Reading a ``state.json`` written by an older epdctl release.

Version 1 kept the launcher handle flat on each process (``pid``/``pgid``/``create_time``; under
SLURM ``pid`` was the job id of the one batch job that ran the whole cluster) and recorded neither
the engine nor the node rank. This fills them in once, when the file is read, so that `status`,
`down` and `logs` keep working on clusters started by the older version.

Earlier version-2 files recorded the command line but not the capabilities the plan now states
(switchable, API key variables, how the router lists the worker, whether the router takes its
workers through its API, the router's metrics host, every port by name): they are read from the
recorded command once, here, the way that release read them on every use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from epdctl.engines import ENGINE_NAMES, engine_for
from epdctl.launchers.kinds import allocates_nodes
from epdctl.render.plan import ROUTER_TYPES
from epdctl.render.router import KEY_WRAPPER, registers_workers


def upgrade_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Read a version-1 state (epdctl before the one-record state): the launcher handle was
    flat on each process (pid/pgid/create_time; slurm: pid = job id, one job for all) and the
    engine and node rank were not recorded. A SLURM v1 cluster was one batch job: it can be
    stopped (scancel) but not rebalanced."""
    out = dict(data, version=2)
    engine = out.setdefault("engine", _engine_of(data.get("topology")))
    procs = []
    for p in data.get("processes", []):
        q = dict(p)
        handle = {"pid": q.pop("pid", 0), "pgid": q.pop("pgid", 0),
                  "create_time": q.pop("create_time", 0.0)}
        if allocates_nodes(data.get("launcher")):  # the SLURM launcher: one batch job
            handle = {"job": str(handle["pid"]), "step": None}
        q["handle"] = handle
        name = q.get("name", "")
        base, sep, rank = name.rpartition(".r")  # version 1 named rank r>0 of a worker NAME.rR
        ranked = bool(sep) and rank.isdigit()
        q.setdefault("worker", base if ranked else name)
        q.setdefault("engine", engine)
        q.setdefault("node_rank", int(rank) if ranked else 0)
        procs.append(q)
    out["processes"] = procs
    return out


def _engine_of(topology: str | None) -> str:
    """The ``engine:`` of the topology a v1 state names (embedded when it cannot be read)."""
    try:
        doc = yaml.safe_load(Path(topology or "").read_text())
        return str(doc.get("engine") or "embedded") if isinstance(doc, dict) else "embedded"
    except (OSError, yaml.YAMLError):
        return "embedded"


# the router key wrapper's module, as earlier releases and this one name it
_KEY_WRAPPERS = ("epdctl.router_exec", KEY_WRAPPER)


def add_capabilities(data: dict[str, Any]) -> dict[str, Any]:
    """A state whose records lack the plan's capabilities (written by an older release): each
    one read from the record's command line; records that have them are left as they are."""
    out = dict(data)
    procs = data.get("processes", [])
    if isinstance(procs, list):  # anything else is reported by the state check, as it was
        out["processes"] = [_capabilities(dict(p)) if isinstance(p, dict) and isinstance(p.get("argv", []), list)
                            else p for p in procs]
    return out


def _flag_value(argv: list[str], flag: str) -> str | None:
    return next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag), None)


def _capabilities(q: dict[str, Any]) -> dict[str, Any]:
    argv = [str(a) for a in q.get("argv") or []]
    role, engine = q.get("role"), q.get("engine")
    switch = engine_for(engine).switch if isinstance(engine, str) and engine in ENGINE_NAMES else None
    q.setdefault("switchable", switch is not None and switch.flag in argv)
    q.setdefault("key_vars", [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--api-key-env" or
                              (a in _KEY_WRAPPERS and i > 0 and argv[i - 1] == "-m")])
    routed = role != "router" and q.get("is_leader", True)
    q.setdefault("router_type", next((t for r, t in ROUTER_TYPES.items() if r.value == role), None)
                 if routed else None)
    if role == "router":
        q.setdefault("registers_workers", registers_workers(argv))
        q.setdefault("prometheus_host", _flag_value(argv, "--prometheus-host"))
        port = _flag_value(argv, "--prometheus-port")
        if q.get("prometheus_port") is None and port is not None and port.isdigit():
            q["prometheus_port"] = int(port)
    return q
