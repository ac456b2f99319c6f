"""A warm spare: a worker started ahead of need that waits, imports done, for its supervisor's go.

The supervisor (epdctl/node/supervise.py) keeps one spare per embedded worker once that worker is
healthy, started with ``EPDCTL_STANDBY_FD`` (the read end of a pipe). The spare pays the slow
part of a start here, while nothing is wrong: the interpreter, torch, transformers and the
role's server modules (seconds on an idle host, tens of seconds on a loaded one). Then it says so
(``S`` on its ready pipe) and blocks on the go pipe. When the worker dies, the supervisor writes ``G``: the spare goes on as a normal
start (preflight, model load, bind, ready byte), so a restart costs the model load instead of
the whole start. EOF (the supervisor stopped or died) ends the spare without a word.
"""

from __future__ import annotations

import importlib
import os

STANDBY_FD_ENV = "EPDCTL_STANDBY_FD"  # the contract with node/supervise.py (not imported: layering)
READY_FD_ENV = "EPDCTL_READY_FD"     # the same pipe the ready byte goes to later (servers/listen.py)
GO = b"G"
LOADED = b"S"                        # written there once the imports are done: the spare is ready
_SERVERS = {"encoder": "encoder", "prefill": "prefill", "decode": "decode", "colocated": "colocated"}


def preload(role: str, switchable: bool, cpus: str | None, threads: int | None) -> None:
    """Import what a start of ``role`` imports (the slow part of a start), pinned and sized as
    the start will be (placement before torch: its thread pool is sized at import)."""
    from epdctl.runtime.placement import apply

    apply(cpus, threads)   # a problem is reported by the start itself, after the go
    importlib.import_module("epdctl.runtime.model")
    importlib.import_module("epdctl.runtime.servers." + ("switchable" if switchable else _SERVERS[role]))


def wait_for_go(role: str, switchable: bool, cpus: str | None = None, threads: int | None = None) -> bool:
    """True: start now (not a spare, or the supervisor said go); False: stand down."""
    raw = os.environ.pop(STANDBY_FD_ENV, "")
    if not raw.isdigit():
        return True
    fd = int(raw)
    try:
        preload(role, switchable, cpus, threads)
        ready = os.environ.get(READY_FD_ENV, "")
        if ready.isdigit():
            os.write(int(ready), LOADED)   # the supervisor shows it (standby: ready)
        return os.read(fd, 1) == GO
    except OSError:
        return False
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
