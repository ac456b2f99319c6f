"""What a switchable worker holds in memory: the checkpoint's weights split into vision tower and
language model, read from the safetensors headers (no torch, nothing loaded).

A safetensors file starts with a little-endian u64 header length and a JSON header mapping each
tensor name to ``{dtype, shape, data_offsets}``; a tensor's bytes are the offsets' difference.
Qwen2-VL-style checkpoints name the vision tower ``visual.*`` / ``model.visual.*``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from epdctl.engines.registry import engine_of
from epdctl.topology.model import Role, Topology

VISION_MARKERS = ("visual.", "vision_tower.", "vision_model.")


@dataclass(frozen=True)
class WeightSplit:
    vision: int     # bytes
    language: int   # bytes

    def role_bytes(self, role: Role) -> int:
        return self.vision if role is Role.ENCODER else self.language


def read_split(model_path: str) -> WeightSplit | None:
    """Vision and language bytes of a local checkpoint folder; None when it cannot be read here."""
    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        return None
    vision = language = 0
    try:
        for f in files:
            with f.open("rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
            for name, t in header.items():
                if name == "__metadata__" or not isinstance(t, dict):
                    continue
                size = int(t["data_offsets"][1]) - int(t["data_offsets"][0])
                if any(m in name for m in VISION_MARKERS):
                    vision += size
                else:
                    language += size
    except (OSError, ValueError, KeyError, struct.error):
        return None
    return WeightSplit(vision, language)


def _mib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def switchable_memory(topo: Topology) -> list[str]:
    """One line per role of switchable workers: what each holds, against its role alone."""
    engine = engine_of(topo)
    workers = [w for w in topo.workers if engine.switchable(topo, w)]
    if not workers:
        return []
    said = engine.switch_memory(topo, workers)
    if said is not None:
        return said
    split = read_split(topo.model.path)
    if split is None:
        return [f"in place: {len(workers)} switchable worker(s) hold vision tower + language model "
                f"(weights of {topo.model.path} not readable here: size unknown)"]
    total = split.vision + split.language
    out = []
    for role in (Role.ENCODER, Role.PREFILL, Role.DECODE):
        n = sum(1 for w in workers if w.role is role)
        if n:
            alone = split.role_bytes(role)
            out.append(f"in place: {n} switchable {role.value}(s) hold {_mib(total)} of weights each "
                       f"(vision {_mib(split.vision)} + language {_mib(split.language)}; "
                       f"+{_mib(total - alone)} over the role alone)")
    return out
