"""Topology -> Plan (per-worker specs in start order + router) and its text forms.

    plan = build_plan(load_topology(path))
    plan.workers  # list[ProcessSpec]: encoders, prefills, decodes (multi-node: one per node rank)
    plan.router   # ProcessSpec | None
"""

from __future__ import annotations

from epdctl.render.output import plan_dict, shell_quote, to_json, to_shell
from epdctl.render.plan import Plan, ProcessSpec, build_plan

__all__ = ["build_plan", "Plan", "ProcessSpec", "to_shell", "to_json", "plan_dict", "shell_quote"]
