"""CPU placement of one worker: pin the process to ``--cpus`` and size torch's thread pool.

The embedded runtime's counterpart of GPU ids: a topology's ``cpus:`` (per worker or role) is
rendered as ``--cpus 0,1``; the worker pins itself with ``os.sched_setaffinity`` before the model
loads and runs as many intra-op threads as it has cores (``--threads`` overrides), so encoders,
prefill and decode on one host can be given their own cores and stop competing for them.
"""

from __future__ import annotations

import os


def parse_cpus(text: str) -> list[int]:
    """"0-3,6" or "0,1" -> sorted CPU ids; ValueError with a readable message otherwise."""
    ids: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
            raise ValueError(f"--cpus {text!r}: write CPU ids like 0,1 or 0-3,6")
        ids.update(range(int(lo), int(hi or lo) + 1))
    return sorted(ids)


def apply(cpus: str | None, threads: int | None) -> str | None:
    """Pin and size the thread pool; a problem message (nothing changed) or None."""
    if cpus:
        try:
            wanted = parse_cpus(cpus)
        except ValueError as exc:
            return str(exc)
        allowed = sorted(os.sched_getaffinity(0))
        missing = [c for c in wanted if c not in allowed]
        if missing:
            return (f"--cpus {cpus}: CPU(s) {','.join(map(str, missing))} are not available to this process "
                    f"(available: {','.join(map(str, allowed))}); fix cpus: in the topology")
        os.sched_setaffinity(0, wanted)
        threads = threads or len(wanted)
    if threads is not None:
        if threads < 1:
            return f"--threads {threads}: must be at least 1"
        os.environ["OMP_NUM_THREADS"] = str(threads)
        import torch

        torch.set_num_threads(threads)
    return None
