"""Topology -> Plan (per-worker specs in start order + router) and its text forms.

    plan = build_plan(load_topology(path))
    plan.workers  # list[WorkerSpec]: encoders, prefills, decodes (multi-node: one per node rank)
    plan.router   # RouterSpec | None
"""

from __future__ import annotations

from epdctl.render.output import plan_dict, shell_quote, to_json, to_shell
from epdctl.render.plan import Plan, RouterSpec, WorkerSpec, build_plan

__all__ = ["build_plan", "Plan", "WorkerSpec", "RouterSpec", "to_shell", "to_json", "plan_dict", "shell_quote"]
