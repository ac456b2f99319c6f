"""How many intra-op threads one decode step runs on: the worker's pool only when the step is big enough.

A decode step is hundreds of small ops. Every op torch or MKL parallelises wakes the pool's other
threads, and a disaggregated decode runs with ``OMP_WAIT_POLICY=PASSIVE`` (idle threads sleep, so
it does not starve encoders on shared cores; see __main__.py), so each wake is a futex round trip.
On the tiny model two threads made steps slower at every batch size measured, with passive
waits and no faster with spinning ones. A model whose GEMMs are large per step (a real Qwen2-VL)
is the opposite case. So a step uses the worker's pool only when its
rows times the language model's multiply-adds per row reach ``POOL_MIN_MACS`` (the tiny model:
1.5 M per row, 24 M at 16 rows, stays on one thread), and the pool is restored after the step
(a colocated worker's prefill runs on the same thread with the full pool).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

POOL_MIN_MACS = 1 << 26  # multiply-adds per step: well above the tiny model's 16-row step (no gain there)


def macs_per_row(lm: torch.nn.Module, lm_head: torch.nn.Linear) -> int:
    """Multiply-adds of the language model's linear layers (and lm_head) for one token."""
    return sum(m.weight.numel() for m in lm.modules() if isinstance(m, torch.nn.Linear)) + lm_head.weight.numel()


class StepThreads:
    def __init__(self, macs_per_row: int, min_macs: int = POOL_MIN_MACS):
        self.macs_per_row = macs_per_row
        self.min_macs = min_macs

    def wanted(self, rows: int, pool: int) -> int:
        return pool if rows * self.macs_per_row >= self.min_macs else 1

    @contextlib.contextmanager
    def applied(self, rows: int) -> Iterator[int]:
        """Run the body on the thread count a step of ``rows`` rows should use; the pool after it."""
        pool = torch.get_num_threads()
        want = self.wanted(rows, pool)
        if want == pool:
            yield want
            return
        torch.set_num_threads(want)
        try:
            yield want
        finally:
            torch.set_num_threads(pool)
