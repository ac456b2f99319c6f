"""The receiver's book of shared-memory segments lent to senders (see same_host.py).

A lease is lent for one announced message (SHM: its header is known) or as a spare handed out
with the answer to the previous message, so a sender's next hand-off needs no lease round trip;
a spare learns its message from SHMGO. Every segment ends in a control block (progress.py),
reset with the lease's token when it is lent. A lease not closed within the timeout is dropped
(its token spoiled, its file unlinked, never reused: the sender may still be writing into it)
and its message fails as truncated; answers given through the control block are kept for that
long too, for a sender that asks again on the socket (SHMDONE).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass

from ...errors import TransferError
from ...transports.base import verify
from ...transports.parts import Incoming
from ...wire import Frame, parse_header
from . import shm
from .progress import CTRL_BYTES, ORDERED, Control, token_of


Spare = tuple[str, bytes, int, float, str]  # a lent segment: name, lease id, size, when, the receiver's doorbell


class SpareGone(Exception):
    """The spare segment a peer lent is no longer there; lease a fresh one."""


def lent(reply: list[bytes]) -> Spare:
    """The segment in an answer [OK, name, xid, size, doorbell]."""
    return reply[1].decode(), reply[2], int(reply[3]), time.monotonic(), reply[4].decode() if len(reply) > 4 else ""


@dataclass
class Lease:
    """A segment lent to a sender: for the message ``incoming`` (None: a spare, until its first part)."""
    started: float
    seg: shm.Segment
    buf: memoryview
    incoming: Incoming | None
    ctrl: Control
    nparts: int = 0
    checked: int = 0                     # parts checked so far
    rung: int = 0                        # parts the sender's rings announced
    poller: asyncio.Future | None = None  # the receiver's poll of ``ctrl`` while the sender writes
    wake: asyncio.Future | None = None    # set by the sender's next ring while the poll sleeps
    reply_to: str = ""                    # the sender's doorbell, rung with the answer
    spare: list[bytes] | None = None      # the spare lent with the answer (lent early, off the critical path)

    def published(self) -> int:
        """Parts the sender published: read from the block where stores stay in order (x86), else only
        what its rings said (a datagram orders memory between the two processes)."""
        return self.ctrl.progress() if ORDERED else self.rung

    async def check(self) -> bool:
        """Check the parts published since the last look; whether there were any."""
        assert self.incoming is not None
        incoming, ctrl = self.incoming, self.ctrl
        first, last = self.checked, min(self.published(), self.nparts)
        if last <= first:
            return False
        self.checked = last
        try:
            parts = [ctrl.part(i) for i in range(first, last)]

            def check(_: object) -> None:
                for part in parts:
                    incoming.add(part, self.buf, whole=True)
            await verify(check, None, sum(incoming.size_of(p) for p in parts))
        except (ValueError, KeyError, TypeError) as exc:  # (a JSONDecodeError is a ValueError)
            incoming.error = incoming.error or TransferError(f"malformed part of {incoming.key!r}: {exc}")
        return True


class Leases:
    def __init__(self, pool: shm.SegmentPool | None, timeout: float):
        self.pool = pool
        self.timeout = timeout
        self.open: dict[str, Lease] = {}
        self.answered: dict[str, tuple[float, list[bytes]]] = {}
        self.bell = ""  # this receiver's doorbell address, given with every lease

    def lend(self, incoming: Incoming | None, nbytes: int) -> list[bytes]:
        """Lease a segment for a message of up to ``nbytes`` (plus its control block): [name, xid,
        size, doorbell], or [] (no /dev/shm, or full). A spare passes its own segment's size."""
        if self.pool is None:
            return []
        try:
            seg = self.pool.lease(nbytes if incoming is None else nbytes + CTRL_BYTES)
        except OSError:
            return []
        xid = uuid.uuid4().hex
        whole = self.pool.view(seg, seg.size).numpy()
        ctrl = Control(whole[seg.size - CTRL_BYTES:])
        ctrl.reset(token_of(xid))
        self.open[xid] = Lease(time.monotonic(), seg, whole.data, incoming, ctrl)
        return [seg.name.encode(), xid.encode(), str(seg.size).encode(), self.bell.encode()]

    def for_message(self, key: str, header: bytes) -> list[bytes]:
        """The answer to SHM: [OK, name, xid, size, doorbell], or [OK] (the sender then uses the socket, where a
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
        if incoming.total > lease.seg.size - CTRL_BYTES:
            incoming.error = TransferError(f"message of {incoming.total} bytes does not fit the lent segment "
                                           f"({lease.seg.size - CTRL_BYTES})")
        lease.incoming = incoming

    def answer(self, xid: str, reply: list[bytes]) -> None:
        """Close a lease with ``reply``, given through its control block and kept for SHMDONE."""
        lease = self.open.pop(xid, None)
        if lease is not None:
            lease.ctrl.answer(reply)
        self.answered[xid] = (time.monotonic(), reply)

    def drop(self, xid: str) -> Lease | None:
        lease = self.open.pop(xid, None)
        if lease is not None:
            lease.ctrl.reset(-1)  # a sender still holding this lease (a spare) finds it gone
            if self.pool is not None:
                self.pool.drop(lease.seg)
        return lease

    def purge(self) -> list[tuple[str, TransferError]]:
        """Drop leases older than the timeout; (key, error) of each message they left half-written."""
        now = time.monotonic()
        failed = []
        for xid in [x for x, lease in self.open.items() if now - lease.started > self.timeout]:
            lease = self.drop(xid)
            if lease is not None and lease.incoming is not None and lease.incoming.key:
                failed.append((lease.incoming.key, TransferError(
                    f"transfer of {lease.incoming.key!r} truncated: the sender wrote {lease.checked} "
                    f"of {lease.nparts or '?'} parts within {self.timeout:g}s (stopped or died)")))
        for xid in [x for x, (t, _) in self.answered.items() if now - t > self.timeout]:
            del self.answered[xid]
        return failed

    def close(self) -> None:
        for lease in self.open.values():
            if lease.poller is not None:
                lease.poller.cancel()
            lease.seg.release()
        self.open.clear()
