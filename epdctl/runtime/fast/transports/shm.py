"""Same-host hand-offs through shared memory: files in /dev/shm, lent by the receiver.

The receiver owns a pool of segments. For a large message it lends one (``lease``), the sender
maps it (``SenderMaps``, mappings cached, so a reused segment costs no page faults) and copies
the payload in with ``wire.fill``; the receiver verifies sizes and checksums and hands out
tensors that are views into the segment. The segment goes back to the pool when the last of
those views is garbage collected, so a hand-off is one copy and two checksums, with no socket
carrying the bytes. A sender that cannot open the lent file is on another host (or in another
/dev/shm namespace): it returns the lease and sends inline; that answer is remembered per peer.

Segments are created with ``posix_fallocate`` so a full /dev/shm is an error at lease time
(answered without a segment: the sender falls back to the socket), never a SIGBUS while writing.
A pool's files are ``epd-<id>.lock`` (flocked while the pool lives) and ``epd-<id>-<n>``; a new
pool sweeps those of dead pools (``sweep_dead``), so a killed receiver leaks nothing for long.
"""

from __future__ import annotations

import collections
import fcntl
import logging
import mmap
import os
import threading
import uuid
import weakref
from dataclasses import dataclass

import numpy as np
import torch

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
_ROUND = 1 << 20             # segment sizes are whole MiB, so a segment serves many message sizes
MAX_IDLE_BYTES = 1 << 30     # idle segments kept for reuse by one receiver
# Segments of 8-24 MiB rotate among ROTATE (oldest idle first) instead of two: a segment is then
# written again only after the receiver has read ~3 others, so its lines have left the receiver's
# caches and the sender's stores need not take each one back from the other core (a copy into a
# segment another core keeps reading is several times slower; handoff_timeline.py compares).
# Smaller ones fit the caches either way; two larger ones already overflow them.
ROTATE, ROTATE_MIN_BYTES, ROTATE_MAX_BYTES = 4, 8 << 20, 24 << 20
_MAPS_PER_SENDER = 32


def available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def sweep_dead() -> int:
    """Unlink segments left by receivers that died without closing (SIGKILL). Every pool holds an
    exclusive flock on its ``<prefix>.lock`` file while it lives and the kernel drops it when the
    process dies (whatever its pid namespace), so a lock we can take marks a dead owner."""
    removed = 0
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return 0
    for lock_name in (n for n in names if n.startswith("epd-") and n.endswith(".lock")):
        prefix = lock_name[:-len(".lock")]
        try:
            fd = os.open(os.path.join(SHM_DIR, lock_name), os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its owner is alive
        finally:
            os.close(fd)
        for name in names:
            if name.startswith(prefix + "-") or name == lock_name:
                try:
                    os.unlink(os.path.join(SHM_DIR, name))
                    removed += 1
                except OSError:
                    pass
    return removed


@dataclass(eq=False)
class Segment:
    name: str
    size: int
    mm: mmap.mmap

    def release(self) -> None:
        """Unlink the file and unmap it (a mapping still viewed by live tensors stays until they die)."""
        try:
            os.unlink(os.path.join(SHM_DIR, self.name))
        except FileNotFoundError:
            pass
        try:
            self.mm.close()
        except BufferError:
            pass


class SegmentPool:
    """Receiver side: lend segments, take them back when the tensors viewing them are gone."""

    def __init__(self, max_idle_bytes: int = MAX_IDLE_BYTES):
        sweep_dead()
        self.prefix = f"epd-{uuid.uuid4().hex[:12]}"
        self._lock_fd = os.open(os.path.join(SHM_DIR, self.prefix + ".lock"), os.O_RDWR | os.O_CREAT | os.O_EXCL,
                                0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        self.max_idle_bytes = max_idle_bytes
        self._idle: list[Segment] = []
        self._all: set[Segment] = set()
        self._lock = threading.Lock()
        self.stats = {"segments_created": 0, "segments_reused": 0}

    def lease(self, nbytes: int) -> Segment:
        """A segment of at least ``nbytes`` (OSError when /dev/shm is full or missing): an idle one,
        else a new one; sizes of ROTATE_MIN_BYTES-ROTATE_MAX_BYTES make new ones until ROTATE of
        them rotate (or /dev/shm is full)."""
        def fit(s: Segment) -> bool:
            return nbytes <= s.size <= max(2 * nbytes, nbytes + _ROUND)
        with self._lock:
            fits = [s for s in self._idle if fit(s)]
            few = ROTATE_MIN_BYTES <= nbytes <= ROTATE_MAX_BYTES and sum(map(fit, self._all)) < ROTATE
        if fits and few:
            try:
                return self._create(nbytes)
            except OSError:
                pass  # /dev/shm is full: reuse one
        if fits:
            with self._lock:
                # the smallest that fits; of equal ones the longest idle (given back first)
                seg = min((s for s in self._idle if fit(s)), key=lambda s: s.size, default=None)
                if seg is not None:
                    self._idle.remove(seg)
                    self.stats["segments_reused"] += 1
                    return seg
        return self._create(nbytes)

    def _create(self, nbytes: int) -> Segment:
        size = max(_ROUND, -(-nbytes // _ROUND) * _ROUND)
        name = f"{self.prefix}-{uuid.uuid4().hex[:12]}"
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
            mm = mmap.mmap(fd, size)
        except OSError:
            os.unlink(os.path.join(SHM_DIR, name))
            raise
        finally:
            os.close(fd)
        seg = Segment(name, size, mm)
        with self._lock:
            self._all.add(seg)
            self.stats["segments_created"] += 1
        return seg

    def view(self, seg: Segment, nbytes: int) -> torch.Tensor:
        """uint8 tensor over the first ``nbytes`` of ``seg``; the segment returns to the pool when
        this tensor and every view of it are gone."""
        arr = np.frombuffer(seg.mm, dtype=np.uint8, count=max(nbytes, 1))
        weakref.finalize(arr, self.give_back, seg)
        return torch.from_numpy(arr)

    def give_back(self, seg: Segment) -> None:
        with self._lock:
            if seg not in self._all:
                return
            if sum(s.size for s in self._idle) + seg.size <= self.max_idle_bytes:
                self._idle.append(seg)
                return
            self._all.discard(seg)
        seg.release()

    def drop(self, seg: Segment) -> None:
        """Forget a segment whose lease was abandoned (a sender may still write into it)."""
        with self._lock:
            self._all.discard(seg)
        seg.release()

    def close(self) -> None:
        with self._lock:
            segs, self._all, self._idle = list(self._all), set(), []
        for seg in segs:
            seg.release()
        if self._lock_fd >= 0:
            try:
                os.unlink(os.path.join(SHM_DIR, self.prefix + ".lock"))
            except OSError:
                pass
            os.close(self._lock_fd)
            self._lock_fd = -1


class BufferPool:
    """Reusable private send buffers (the socket path's staging), so a large message costs no page
    faults the second time. A buffer is taken for one send and given back only once the peer
    acknowledged it (every byte left the process); one lost in a failed send is simply dropped."""

    def __init__(self, max_idle_bytes: int = 256 << 20):
        self.max_idle_bytes = max_idle_bytes
        self._idle: list[np.ndarray] = []

    def take(self, nbytes: int) -> np.ndarray:
        fits = [i for i, b in enumerate(self._idle) if nbytes <= b.nbytes <= max(2 * nbytes, nbytes + _ROUND)]
        if fits:
            return self._idle.pop(min(fits, key=lambda i: self._idle[i].nbytes))
        return np.empty(max(_ROUND, -(-nbytes // _ROUND) * _ROUND) if nbytes > 64 * 1024 else max(nbytes, 1),
                        dtype=np.uint8)

    def give(self, buf: np.ndarray) -> None:
        if sum(b.nbytes for b in self._idle) + buf.nbytes <= self.max_idle_bytes:
            self._idle.append(buf)


class SenderMaps:
    """Sender side: name -> mapping of the receivers' segments, least recently used unmapped first."""

    def __init__(self, limit: int = _MAPS_PER_SENDER, directory: str = SHM_DIR):
        self.limit = limit
        self.directory = directory
        self._maps: collections.OrderedDict[str, mmap.mmap] = collections.OrderedDict()

    def open(self, name: str, nbytes: int) -> np.ndarray:
        """The segment ``name`` as a writable array (FileNotFoundError: not on this host)."""
        if "/" in name or name.startswith("."):
            raise FileNotFoundError(name)
        mm = self._maps.get(name)
        if mm is None or len(mm) < nbytes:
            fd = os.open(os.path.join(self.directory, name), os.O_RDWR)
            try:
                mm = mmap.mmap(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
            self._maps[name] = mm
            while len(self._maps) > self.limit:
                _, old = self._maps.popitem(last=False)
                _close(old)
        self._maps.move_to_end(name)
        return np.frombuffer(mm, dtype=np.uint8, count=nbytes)

    def close(self) -> None:
        for mm in self._maps.values():
            _close(mm)
        self._maps.clear()


def _close(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:  # an array over it is still alive; the mapping goes when it does
        pass
