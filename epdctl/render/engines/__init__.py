"""Engine registry: each engine module renders one worker process as (argv, env)."""

from __future__ import annotations

from types import ModuleType

from epdctl.render.engines import embedded, sglang, vllm

ENGINES: dict[str, ModuleType] = {"sglang": sglang, "vllm": vllm, "embedded": embedded}
