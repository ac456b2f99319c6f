"""Workers that share one host's cores (the embedded engine on a CPU machine). Pure.

The profile measures each role on a quiet host, so on a machine where every worker is a process
on the same C cores, one worker's capacity is not its own: while it serves, the others are
busy too. Model: each busy worker wants one core; with B cores' worth of work on average (CPU
seconds per second, from the profile's per-role CPU cost), the number of *other* busy workers
is taken as Poisson(B), and a busy worker runs at C / (1 + others) of its speed when that
exceeds C. The expected slowdown multiplies every service time (encode, prefill, decode step). The
host is full when B approaches C, whatever the split: no E:P:D ratio fixes that.
"""

from __future__ import annotations

import math


def slowdown(busy: float, cores: float) -> float:
    """E[max(1, (1 + X) / cores)] for X ~ Poisson(busy): how much slower a busy worker runs."""
    if cores <= 0:
        raise ValueError("cores must be > 0")
    if busy <= 0:
        return max(1.0, 1.0 / cores)
    total, pk = 0.0, math.exp(-busy)
    k, mass = 0, 0.0
    while mass < 1.0 - 1e-9 and k < 10_000:
        total += pk * max(1.0, (1 + k) / cores)
        mass += pk
        k += 1
        pk *= busy / k
    return total + (1.0 - mass) * max(1.0, (1 + k) / cores)


def contention(work: float, cores: float) -> float:
    """Fixed point of k = slowdown(work * k): a slowed worker stays busy longer. inf when the
    work alone fills the cores."""
    if work >= cores:
        return math.inf
    k = 1.0
    for _ in range(200):
        nk = slowdown(work * k, cores)
        if abs(nk - k) < 1e-9:
            return nk
        k = nk
        if k > 1e6:
            return math.inf
    return k
