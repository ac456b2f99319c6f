"""The reference path's hooks: what a worker does around its engines and transports, plainly.

The fast path (fast/__init__.py) subclasses this and fills the hooks in (paths.py selects one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .memtrim import after_large, malloc_trim

if TYPE_CHECKING:
    from .decode_engine import DecodeEngine
    from .metrics import Registry
    from .model import ModelBundle

TRIM_AFTER_PIXELS = 4_000_000  # a vision pass that decoded more pixels returns free heap pages afterwards


class Reference:
    """The reference path: every hook does nothing beyond plain torch and ZMQ."""

    name = "reference"
    shm = False  # transports hand messages over on the socket only

    def decode_engine(self, bundle: "ModelBundle", max_running: int, keep_logits: bool = False) -> "DecodeEngine":
        from .decode_engine import DecodeEngine
        return DecodeEngine(bundle, max_running=max_running, keep_logits=keep_logits)

    def serving(self) -> None:
        """Called once the worker's listeners are up."""

    def add_metrics(self, m: "Registry") -> None:
        """Metrics this path adds to a worker's /metrics."""

    def after_body(self, nbytes: int) -> None:
        """Called after a request body of ``nbytes`` was parsed: a large one schedules a heap trim,
        so a worker's RSS stays bounded (memtrim.py)."""
        after_large(nbytes)

    def after_images(self, pixels: int) -> None:
        """Called after a vision pass over ``pixels`` decoded pixels: a large pass returns the
        freed decode buffers to the OS."""
        if pixels > TRIM_AFTER_PIXELS:
            malloc_trim()
