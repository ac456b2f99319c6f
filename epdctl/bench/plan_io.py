"""What `epdctl plan` reads and writes around the pure planner: SLO strings and topologies.

Kept apart from ``planner.py`` so the model stays a page of arithmetic; these are the
user-facing edges (parsing ``--slo``, resizing a topology mapping for ``--write``).
"""

from __future__ import annotations

from typing import Any

from epdctl.bench.planner import ROLES, SLO, PlanError


def parse_slo(text: str | None) -> SLO:
    """``ttft=500ms,tpot=50ms`` (units ms or s; bare numbers are ms) -> SLO."""
    if not text:
        return SLO()
    vals: dict[str, float] = {}
    for part in text.split(","):
        key, sep, raw = part.strip().partition("=")
        key = key.strip().lower()
        if not sep or key not in ("ttft", "tpot"):
            raise PlanError(f"--slo {text!r}: expected ttft=500ms,tpot=50ms")
        raw = raw.strip().lower()
        scale = 1000.0 if raw.endswith("s") and not raw.endswith("ms") else 1.0
        try:
            v = float(raw.removesuffix("ms").removesuffix("s")) * scale
        except ValueError:
            raise PlanError(f"--slo {text!r}: {raw!r} is not a time like 500ms or 0.5s") from None
        if v <= 0:
            raise PlanError(f"--slo {text!r}: {key} must be > 0")
        vals[key + "_ms"] = v
    return SLO(**vals)


def retopology(doc: dict[str, Any], counts: dict[str, int]) -> dict[str, Any]:
    """A copy of a topology mapping with new role counts (``roles.<role>.count``)."""
    roles = doc.get("roles") if isinstance(doc, dict) else None
    if not isinstance(roles, dict) or not all(isinstance(roles.get(r), dict) for r in ROLES):
        raise PlanError("the topology must define roles encoder, prefill and decode to be "
                        "resized (a colocated topology has nothing to split)")
    out = dict(doc)
    out["roles"] = dict(roles)
    for r in ROLES:
        role = dict(roles[r])
        if "workers" in role:
            raise PlanError(f"roles.{r} lists its workers explicitly; give it `nodes` and `count` "
                            "so the plan can change how many there are")
        role["count"] = int(counts[r])
        out["roles"][r] = role
    return out
