"""Busy time of a worker's compute thread: the role's OWN work, for the rebalance policy.

A queue seen from outside mixes stages: a prefill request waiting for its embeddings is
"running" on the prefill, a decode request waiting for its KV is "waiting" on the decode. What
a role really spends is the wall time its single compute thread (the vision tower's, the
prefill's model thread, the decode's step loop) is occupied. Each worker exports it as
``epd_<role>_busy_seconds_total``; its rate per second is the role's utilisation (0..1 per
worker), and ``epd_<role>_own_queue_depth`` is the work queued for that thread alone.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Callable

from epdctl.runtime.metrics import Registry


class BusyClock:
    """Accumulates the seconds spent inside ``with clock:`` (one thread at a time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = 0.0
        self._since: float | None = None

    def __enter__(self) -> "BusyClock":
        with self._lock:
            self._since = time.perf_counter()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        with self._lock:
            if self._since is not None:
                self._done += time.perf_counter() - self._since
            self._since = None

    @property
    def active(self) -> bool:
        return self._since is not None

    def total(self) -> float:
        """Busy seconds so far, the span running now included (monotonic across scrapes)."""
        with self._lock:
            since = self._since
            return self._done + (time.perf_counter() - since if since is not None else 0.0)


def own_work_metrics(m: Registry, busy: BusyClock | Callable[[], float],
                     own_queue: Callable[[], int]) -> None:
    """``busy_seconds_total`` and ``own_queue_depth`` on a role's registry (same names in every role)."""
    total = busy.total if isinstance(busy, BusyClock) else busy
    m.counter_fn("busy_seconds_total", "Seconds this worker's compute thread spent on its own role's "
                 "work (rate = utilisation, 0..1)", total)
    m.gauge("own_queue_depth", "Work queued for this worker's compute thread alone (not waiting on "
            "another stage)", lambda: float(own_queue()))
