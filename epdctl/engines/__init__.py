"""Engine records: what epdctl knows about each engine release (command, ports, GPU use, transfer
backends, in-place role switch, drain, canary, flag table). The rest of the control plane reads
a record from :func:`engine_for` and never branches on an engine's name.

    eng = engine_of(topo)
    argv, env = eng.worker_command(ctx)
    eng.uses_gpus, eng.switchable(topo, worker), eng.flags(role).check(args)
"""

from __future__ import annotations

# The topology loader (epdctl.topology) reads the records through epdctl.engines.registry, and the
# records use the topology's model: the loader loads first, then the records, whichever is imported.
import epdctl.topology  # noqa: F401
from epdctl.engines.base import Canary, Engine, ImportTraits, RoleSwitch
from epdctl.engines.registry import CPU_ENGINE, ENGINE_NAMES, GPU_ENGINE, RECORDS, UnknownEngine, engine_for, engine_of

__all__ = ["CPU_ENGINE", "ENGINE_NAMES", "GPU_ENGINE", "Canary", "Engine", "ImportTraits", "RECORDS", "RoleSwitch", "UnknownEngine",
           "engine_for", "engine_of"]
