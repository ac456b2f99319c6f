"""Give freed heap memory back to the OS after large requests, so a worker's RSS stays bounded.

glibc keeps freed memory mapped in its arenas (and raises its mmap threshold after large
frees, so later multi-megabyte bodies land in the heap too). After a burst of large request
bodies or decoded images, ``malloc_trim(0)`` returns the free pages; it runs at most once per
``TRIM_DELAY_S`` on the event loop, never per request.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

LARGE_BYTES = 1024 * 1024   # a body or decoded image at least this big schedules a trim
TRIM_DELAY_S = 0.5
_pending: set[int] = set()   # ids of event loops with a trim already scheduled


def malloc_trim() -> None:
    """Return free heap pages to the OS (glibc only; a no-op elsewhere)."""
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def after_large(nbytes: int) -> None:
    """Call after handling ``nbytes`` of request data; schedules one trim shortly after a large one."""
    if nbytes < LARGE_BYTES:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        malloc_trim()
        return
    if id(loop) in _pending:
        return
    _pending.add(id(loop))

    def run() -> None:
        _pending.discard(id(loop))
        malloc_trim()

    loop.call_later(TRIM_DELAY_S, run)
