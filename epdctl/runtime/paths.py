"""Which implementation this worker process runs: the reference path or the fast one.

The reference path is plain torch and ZMQ. The fast path (``fast/``, ``--fast``) swaps in CPU
speed-ups behind the same calls: the decode step, the copy-and-hash of hand-offs, a shared-memory
hand-off between workers on one host, heap-threshold and garbage-collector tuning. The choice is made once
per process, before any engine or transport is built (``select``); ``active()`` is what the
servers ask. Nothing under ``fast/`` is imported unless it is selected.
"""

from __future__ import annotations

from .reference import Reference

_active: list[Reference] = [Reference()]


def select(fast: bool) -> Reference:
    """Make the fast path (or the reference) this process's path; returns it."""
    if fast:
        from .fast import FastPath
        _active[0] = FastPath()
    else:
        _active[0] = Reference()
    return _active[0]


def active() -> Reference:
    return _active[0]
