"""Reading a version-1 ``state.json`` (epdctl before the one-record state).

Version 1 kept the launcher handle flat on each process (``pid``/``pgid``/``create_time``; under
SLURM ``pid`` was the job id of the one batch job that ran the whole cluster) and recorded neither
the engine nor the node rank. This fills them in once, when the file is read, so that `status`,
`down` and `logs` keep working on clusters started by the older version.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from epdctl.state import worker_of


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
        if data.get("launcher") == "slurm":
            handle = {"job": str(handle["pid"]), "step": None}
        q["handle"] = handle
        q.setdefault("worker", worker_of(q.get("name", "")))
        q.setdefault("engine", engine)
        base, sep, rank = q.get("name", "").rpartition(".r")
        q.setdefault("node_rank", int(rank) if sep and rank.isdigit() else 0)
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
