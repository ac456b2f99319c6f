"""Received frames land in reused heap memory, not in pages mapped afresh for every message.

libzmq mallocs every received message (a 2 MiB part, a frame of up to 16 MiB). glibc serves an
allocation above its mmap threshold with pages mapped for it alone (each faulted in on first
write, then unmapped on free), and gives the top of a heap back to the OS above its trim
threshold; both thresholds start low (128 KiB) and rise only after a large free, so whether a
large tcp hand-off's parts reuse memory depends on the process's history: a receiver that does
not reuse takes minor page faults on every part, and most of its CPU per hand-off goes there
(``lab/benchmarks/handoff_timeline.py --channel tcp`` shows it). ``keep_frames()`` fixes both thresholds
once per process at the values glibc's own adjustment reaches after one 32 MiB free (mmap 32
MiB, the most it allows; trim 64 MiB), so every frame of <= 16 MiB comes from the heap and its
memory serves the next message. Free pages still go back after large requests
(``runtime/memtrim.py`` trims explicitly). glibc only; elsewhere a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3   # mallopt's parameter numbers (malloc.h)
MMAP_THRESHOLD = 32 << 20   # glibc's maximum (HEAP_MAX_SIZE / 2 on 64-bit hosts)
TRIM_THRESHOLD = 64 << 20   # twice the mmap threshold, as glibc's dynamic adjustment sets it
_done: list[bool] = []


def keep_frames() -> bool:
    """Fix the heap thresholds (once per process); whether this host's libc took them."""
    if _done:
        return _done[0]
    ok = False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    except (OSError, AttributeError) as exc:  # not glibc (musl has no mallopt): nothing to tune
        log.debug("heap thresholds left alone: %s", exc)
    _done.append(ok)
    return ok
