"""The cluster's exclusive lock (``clusters/<name>/lock``), a part of ClusterDir (state.py).

A command that changes the cluster (`up`, `down`, `rebalance`) holds it, so two of them never
interleave; the holder's command and pid are written into the file, so a refused command names
who holds it, and a state left 'starting' with no holder was left by an `up` that was killed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import Iterator

from epdctl.errors import StateError


class ClusterLock:
    """Mixed into ClusterDir, which provides ``name``, ``root`` and ``lock_file``."""

    name: str
    root: Path

    @property
    def lock_file(self) -> Path:
        return self.root / "lock"

    def lock_holder(self) -> str | None:
        """Who holds the cluster's lock now (``epdctl up, pid N``), None when nobody does: a
        state left 'starting' with no holder was left by an `up` that was killed."""
        if not self.lock_file.exists():
            return None
        fd = os.open(self.lock_file, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            return None
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def lock(self, command: str, timeout: float = 0.0) -> Iterator[None]:
        """Hold the cluster's exclusive lock; StateError naming the holder if it is taken."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
                        raise StateError(
                            f"cluster {self.name!r} is busy: another epdctl command holds its "
                            f"lock ({holder or 'unknown holder'}); wait for it to finish"
                        ) from None
                    time.sleep(0.05)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"epdctl {command}, pid {os.getpid()}".encode(), 0)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock
