"""A worker's garbage-collector pauses: the startup heap frozen, every pause counted.

After loading, a worker holds ~380,000 Python objects (transformers, torch, the tokenizer, the
HTTP stack), and a full collection walks all of them, landing on whatever request is in flight — a decode's
token gap, a prefill's time to first token. Nothing allocated at startup is ever garbage, so
``freeze_startup_heap`` moves it to the permanent generation once the worker serves
(``gc.freeze``, CPython's documented use for long-lived processes): later collections walk only
what requests allocated since (a full collection then takes well under a millisecond).
``PAUSES`` times every collection from the gc callbacks, exported as ``gc_*`` metrics
(``metrics``), so a tail-latency spike can be matched to a pause.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from ..metrics import Registry


class Pauses:
    """Collections seen since start: how many, their total and the longest, in seconds."""

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.longest = 0.0
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        # Runs inside the collector, in whichever thread triggered it: arithmetic only, no locks.
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        took = time.perf_counter() - self._t0
        self.count += 1
        self.total += took
        self.longest = max(self.longest, took)


PAUSES = Pauses()


def freeze_startup_heap() -> int:
    """Collect once, freeze what survived and start timing collections; the objects frozen."""
    gc.collect()
    gc.freeze()
    if PAUSES not in gc.callbacks:
        gc.callbacks.append(PAUSES)
    return gc.get_freeze_count()


def metrics(m: Registry) -> None:
    """``gc_pauses_total``, ``gc_pause_seconds_total``, ``gc_pause_longest_seconds`` and
    ``gc_frozen_objects`` on ``m``."""
    m.counter_fn("gc_pauses_total", "Garbage collections since the worker started serving", lambda: float(PAUSES.count))
    m.counter_fn("gc_pause_seconds_total", "Seconds the garbage collector paused this worker's threads",
                 lambda: PAUSES.total)
    m.gauge("gc_pause_longest_seconds", "The longest single garbage-collection pause since start",
            lambda: PAUSES.longest)
    m.gauge("gc_frozen_objects", "Objects of the startup heap the collector no longer walks (gc.freeze)",
            lambda: float(gc.get_freeze_count()))
