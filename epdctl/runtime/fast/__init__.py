"""The fast path: CPU speed-ups behind the reference path's calls (``--fast``, paths.py).

Nothing here changes what a worker answers: the decode step is checked against the reference
step at load (fast/decode.py, and the fused GEMMs bit for bit in decode_forward.py), the native
copy-and-hash gives xxhash's values, and the shared-memory hand-off carries the same parts as the
socket. Each piece falls back to the reference where it does not build or does not fit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..reference import Reference

if TYPE_CHECKING:
    from ..decode_engine import DecodeEngine
    from ..metrics import Registry
    from ..model import ModelBundle


class FastPath(Reference):
    name = "fast"
    shm = True

    def __init__(self) -> None:
        from .. import wire
        from .native_copy import NativeCopyHash
        wire.use_accelerator(NativeCopyHash())

    def decode_engine(self, bundle: "ModelBundle", max_running: int, keep_logits: bool = False) -> "DecodeEngine":
        from .decode import FastDecodeEngine
        return FastDecodeEngine(bundle, max_running=max_running, keep_logits=keep_logits)

    def serving(self) -> None:
        from . import gcpause
        gcpause.freeze_startup_heap()

    def add_metrics(self, m: "Registry") -> None:
        from . import gcpause
        gcpause.metrics(m)
