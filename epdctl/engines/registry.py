"""The registry of engine records: every known release, looked up by name (and version)."""

from __future__ import annotations

from epdctl.engines.base import Engine
from epdctl.engines.embedded import EMBEDDED
from epdctl.engines.sglang import SGLANG_0_5_23, SGLANG_0_5_23_CPU
from epdctl.engines.vllm import VLLM_0_32_0, VLLM_0_33_0
from epdctl.errors import RenderError
from epdctl.topology.model import Topology

# every known release, the default (installed) one of each engine first
RECORDS: tuple[Engine, ...] = (SGLANG_0_5_23, SGLANG_0_5_23_CPU, VLLM_0_33_0, VLLM_0_32_0, EMBEDDED)
ENGINE_NAMES: tuple[str, ...] = tuple(dict.fromkeys(e.name for e in RECORDS))
CPU_ENGINE = EMBEDDED.name  # what `epdctl init` picks for nodes without GPUs
GPU_ENGINE = SGLANG_0_5_23.name  # and for GPU nodes


class UnknownEngine(RenderError):
    """A topology or state names an engine (or release) epdctl has no record of."""


class UnknownDevice(UnknownEngine):
    """A topology names an engine.device the engine's release has no record for."""


def engine_for(name: str, version: str | None = None, device: str | None = None) -> Engine:
    """The record of engine ``name`` (its default release, or ``version``: exact, or a release it
    is a prefix of, "0.32" for 0.32.0), in its default form or the one for ``device``."""
    found = [e for e in RECORDS if e.name == name]
    if not found:
        raise UnknownEngine(f"unknown engine {name!r}; known engines: {', '.join(ENGINE_NAMES)}")
    if version is not None:
        found = [e for e in found if e.version == version or e.version.startswith(version + ".")]
        if not found:
            known = dict.fromkeys(e.version for e in RECORDS if e.name == name)
            raise UnknownEngine(f"unknown {name} version {version!r}; known: {', '.join(known)}")
    release = [e for e in found if e.version == found[0].version]
    if device is None:
        return release[0]
    for e in release:
        if e.device == device:
            return e
    forms = [e.device for e in release if e.device is not None]
    takes = f"takes engine.device {' or '.join(forms)}" if forms else "names no device: leave engine.device out"
    raise UnknownDevice(f"{name} {release[0].version} has no device {device!r}; it {takes}")


def engine_of(topo: Topology) -> Engine:
    """The record a topology names (``engine:`` and its ``version``)."""
    return engine_for(topo.engine, topo.engine_version, topo.engine_device)
