"""The receiver's book of shared-memory segments lent to senders (see zmq.py's same-host path).

A lease is lent for one announced message (SHM: its header is known) or as a spare handed out
with the answer to the previous message, so a sender's next hand-off needs no lease round trip;
a spare learns its message from that message's first part. A lease not closed within the
timeout is dropped (its file unlinked, never reused: the sender may still be writing into it).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from ..errors import TransferError
from ..wire import Frame, parse_header
from . import shm
from .parts import Incoming


@dataclass
class Lease:
    """A segment lent to a sender: for the message ``incoming`` (None: a spare, until its first part)."""
    started: float
    seg: shm.Segment
    buf: memoryview
    incoming: Incoming | None


class Leases:
    def __init__(self, pool: shm.SegmentPool | None, timeout: float):
        self.pool = pool
        self.timeout = timeout
        self.open: dict[str, Lease] = {}

    def lend(self, incoming: Incoming | None, nbytes: int) -> list[bytes]:
        """Lease a segment of at least ``nbytes``: [name, xid, size], or [] (no /dev/shm, or full)."""
        if self.pool is None:
            return []
        try:
            seg = self.pool.lease(nbytes)
        except OSError:
            return []
        xid = uuid.uuid4().hex
        self.open[xid] = Lease(time.monotonic(), seg, self.pool.view(seg, seg.size).numpy().data, incoming)
        return [seg.name.encode(), xid.encode(), str(seg.size).encode()]

    def for_message(self, key: str, header: bytes) -> list[bytes]:
        """The answer to SHM: [OK, name, xid, size], or [OK] (the sender then uses the socket, where a
        bad header fails loudly)."""
        try:
            incoming = Incoming.open(key, parse_header(header))
        except (TransferError, KeyError, ValueError, TypeError):
            return [b"OK"]
        return [b"OK", *self.lend(incoming, incoming.total)]

    def announce(self, lease: Lease, key: str, header: Frame) -> None:
        """A spare's first part names its message: open its receiving state (or its error)."""
        try:
            incoming = Incoming.open(key, parse_header(header))
        except (TransferError, KeyError, ValueError, TypeError) as exc:
            incoming = Incoming(key, {"tensors": [], "meta": {}}, [], 0)
            incoming.error = exc if isinstance(exc, TransferError) else TransferError(f"bad message header: {exc}")
        if incoming.total > lease.seg.size:
            incoming.error = TransferError(f"message of {incoming.total} bytes does not fit the lent segment "
                                           f"({lease.seg.size})")
        lease.incoming = incoming

    def drop(self, xid: str) -> None:
        lease = self.open.pop(xid, None)
        if lease is not None and self.pool is not None:
            self.pool.drop(lease.seg)

    def purge(self) -> None:
        now = time.monotonic()
        for xid in [x for x, lease in self.open.items() if now - lease.started > self.timeout]:
            self.drop(xid)

    def close(self) -> None:
        for lease in self.open.values():
            lease.seg.release()
        self.open.clear()
