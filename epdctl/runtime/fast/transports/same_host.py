"""The zmq transport's same-host path: a message written into a /dev/shm segment the receiver
lends, announced by a doorbell and answered through the segment's control block.

Sender: take the spare segment the receiver lent with its last answer (else lease one: SHM on
the socket), ring GO at the receiver's doorbell (``doorbell.py``; SHMGO on the socket when it
cannot ring), write the message part by part (copy and hash in one pass, ``parts.py``),
publishing each part in the control block (``progress.py``) and ringing P, then poll the block
briefly for the answer and sleep until the ACK ring. Receiver: on GO, check part i while part
i+1 is written (polling briefly, then sleeping until the next P; the sender rings P only when
the block says the receiver sleeps, or always where stores may be reordered), deliver the
message (or its damage), write the answer with the next spare and ring ACK. A hand-off that
found a spare puts no message on the ZMQ socket. Every wait is bounded: a poll stops after
``POLL_IDLE_S`` without a new part, and a sender that gets no answer in time asks on the socket
(SHMDONE), which the receiver answers there.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Protocol

import numpy as np

from ...errors import TransferError
from ...transports.parts import Incoming, Sums, Writer, part_header, span, split
from ...transports.zmq import Outgoing
from . import shm
from .doorbell import Doorbell
from .leases import Lease, Leases, Spare, SpareGone, lent
from .progress import (ACK_SPIN_S, CTRL_BYTES, MAX_PARTS, ORDERED, POLL_IDLE_S, POLL_SPIN_S, Control, ack_spin_s, fits, pause,
                       token_of)

class Host(Protocol):
    """What the same-host path uses of the zmq transport it serves."""

    timeout: float
    stats: dict[str, int]
    part_bytes: int
    large_part_bytes: int
    pipeline_min_bytes: int

    async def request(self, peer_endpoint: str, frames: Any, what: str, copy: bool = True,
                      stream: Any = None) -> list[bytes]: ...

    async def write_part(self, write: Writer, dst: np.ndarray, first: int, last: int,
                         nbytes: int) -> tuple[Sums, list[int]]: ...

    async def post(self, peer_endpoint: str, frames: Any, what: str) -> None: ...

    def finish(self, incoming: Incoming) -> list[bytes]: ...

    def purge(self) -> None: ...


class SameHost:
    """Both ends of the shared-memory hand-off for one transport: the segments it lends (``leases``),
    the peers' segments it writes into (``maps``, ``spares``) and the doorbell both ring."""

    def __init__(self, t: Host, pool: shm.SegmentPool | None):
        self.t = t
        self.pool = pool
        self.maps = shm.SenderMaps()
        self.leases = Leases(pool, t.timeout)
        self.spares: dict[str, Spare] = {}  # peer -> segment it lent for the next message
        self.on_host: dict[str, bool] = {}  # peer -> whether it shares this host (learnt by the first lease)
        self.acks: dict[str, asyncio.Future[None]] = {}  # lease id -> rung when its answer is in
        self.bell = Doorbell(self.ring)
        self._purge_timer: asyncio.TimerHandle | None = None

    def open(self) -> None:
        if self.bell.open():
            self.leases.bell = self.bell.address

    def purge_later(self) -> None:
        """Purge once the timeout has passed (no message may come to trigger it), while leases are open."""
        def tick() -> None:
            self._purge_timer = None
            self.t.purge()
            if self.leases.open:
                self.purge_later()
        if self._purge_timer is None:
            self._purge_timer = asyncio.get_running_loop().call_later(self.t.timeout + 0.05, tick)

    def close(self) -> None:
        if self._purge_timer is not None:
            self._purge_timer.cancel()
        self.bell.close()
        self.maps.close()
        self.leases.close()
        if self.pool is not None:
            self.pool.close()

    async def send(self, peer: str, msg: Outgoing) -> list[int] | None:
        """Hand ``msg`` over through shared memory: the lengths written, or None when the peer is not
        on this host (or the message does not suit the path): the caller then uses the socket."""
        size = self.t.part_bytes if msg.total >= self.t.pipeline_min_bytes else self.t.large_part_bytes
        cuts = split(msg.header["tensors"], msg.offsets, msg.total, max(size, -(-msg.total // MAX_PARTS)))
        if cuts[-1][1] - cuts[-1][0] > 1:  # the last tensor a part of its own: the receiver's check trails by less
            first, last = cuts.pop()
            cuts += [(first, last - 1), (last - 1, last)]
        if not fits(len(msg.header["tensors"]), len(cuts)):
            return None
        spare = self.spares.pop(peer, None)
        if spare is not None and spare[2] >= msg.total + CTRL_BYTES and time.monotonic() - spare[3] < self.t.timeout / 2:
            try:
                return await self._write(peer, msg, cuts, spare, spare=True)
            except SpareGone:
                pass  # purged, or the receiver restarted: lease one now
        reply = await self.t.request(peer[4:], [b"SHM", msg.key.encode(), msg.header_json], f"send {msg.key!r}")
        if len(reply) < 4:  # the receiver has no shared memory to lend
            self.on_host[peer] = False
            return None
        return await self._write(peer, msg, cuts, lent(reply), spare=False)


    async def _write(self, peer: str, msg: Outgoing, cuts: list[tuple[int, int]], seg: Spare,
                     spare: bool) -> list[int] | None:
        endpoint, what = peer[4:], f"send {msg.key!r}"
        name, xid, size = seg[0], seg[1], seg[2]
        try:
            whole = self.maps.open(name, size)
        except (OSError, ValueError):
            if spare:
                raise SpareGone() from None
            self.on_host[peer] = False
            await self.t.request(endpoint, [b"DROP", xid], what)
            return None
        ctrl = Control(whole[size - CTRL_BYTES:])
        if not ctrl.claim(token_of(xid.decode())):
            if spare:
                raise SpareGone()
            raise TransferError(f"{what}: the segment {peer} lent was taken back before it was written")
        self.on_host[peer] = True
        try:
            reply = await self._hand_over(endpoint, msg, cuts, ctrl, whole, xid, seg[4])
        except TransferError as exc:
            if spare and "unknown or expired" in str(exc):
                raise SpareGone() from exc
            self.t.stats["shm_sent"] += 1
            raise
        self.t.stats["shm_sent"] += 1
        if len(reply) >= 4:  # a spare segment for the next message
            self.spares[peer] = lent(reply)
        return msg.lengths


    async def _hand_over(self, endpoint: str, msg: Outgoing, cuts: list[tuple[int, int]], ctrl: Control,
                         whole: np.ndarray, xid: bytes, bell: str) -> list[bytes]:
        """GO, the parts written and published one by one, DONE, then the answer (rung, else asked for)."""
        what = f"send {msg.key!r}"
        go_msg = b"G" + json.dumps([xid.decode(), msg.key, len(cuts), self.bell.address]).encode() + b"\0" + msg.header_json
        rung = bool(bell) and self.bell.ring(bell, go_msg)
        if not rung:
            await self.t.post(endpoint, [b"SHMGO", xid, msg.key.encode(), msg.header_json, str(len(cuts)).encode()], what)
        acked = asyncio.get_running_loop().create_future()
        self.acks[xid.decode()] = acked
        try:
            msg.lengths = []
            for i, (first, last) in enumerate(cuts):
                start, end = span(msg.offsets, msg.total, first, last)
                sums, written = await self.t.write_part(msg.write, whole, first, last, end - start)
                msg.lengths.extend(written)
                ctrl.publish(i, part_header(first, sums, written))
                if rung and (not ORDERED or ctrl.asleep()):  # a receiver that polls needs no ring
                    self.bell.ring(bell, b"P%s %d" % (xid, i + 1))
            # the receiver trails by about one part: poll for its answer a little, then sleep until it rings
            reply = await ctrl.wait_reply(ACK_SPIN_S if rung else ack_spin_s(msg.total)) if ORDERED else None
            if reply is None and rung:
                self.bell.ring(bell, b"D%s %d" % (xid, len(cuts)))  # (restarts the receiver's poll if it had stopped)
                timer = asyncio.get_running_loop().call_later(ack_spin_s(msg.total) * 4, acked.cancel)
                try:
                    await acked
                except asyncio.CancelledError:
                    if not acked.cancelled():  # the caller was cancelled, not the wait
                        raise
                finally:
                    timer.cancel()
                reply = ctrl.reply()
        finally:
            self.acks.pop(xid.decode(), None)
        if reply is None:  # the receiver is not polling (asleep, slow or gone): ask on the socket
            return await self.t.request(endpoint, [b"SHMDONE", xid, str(len(cuts)).encode()], what)
        if reply[0] != b"OK":
            detail = reply[1].decode(errors="replace") if len(reply) > 1 else "no detail"
            raise TransferError(f"{what}: peer {endpoint} rejected the transfer: {detail}")
        return reply


    def ring(self, data: bytes) -> None:
        """A doorbell ring: G (a sender starts writing), P (it published a part), D (it wrote every
        part), A (our answer is in)."""
        kind, body = data[:1], data[1:]
        if kind == b"A":
            acked = self.acks.get(body.decode(errors="replace"))
            if acked is not None and not acked.done():
                acked.set_result(None)
        elif kind == b"G":
            head, _, header = body.partition(b"\0")
            xid, key, nparts, reply_to = json.loads(head)
            self.go(str(xid), str(key), header, nparts, str(reply_to))
        elif kind in (b"P", b"D"):  # [xid, parts published so far]
            xid, _, count = body.decode(errors="replace").partition(" ")
            lease = self.leases.open.get(xid)
            if lease is None or not count.isdigit():
                return
            lease.rung = max(lease.rung, int(count))
            if lease.wake is not None and not lease.wake.done():
                lease.wake.set_result(None)
            elif kind == b"D" and lease.poller is not None and lease.poller.done():  # it stopped polling
                lease.poller = asyncio.ensure_future(self._poll(xid, lease))


    def go(self, xid: str, key: str, header: bytes | memoryview, nparts: object, reply_to: str = "") -> None:
        """The sender starts writing into the lease ``xid`` (GO or SHMGO): poll it."""
        lease = self.leases.open.get(xid)
        if lease is None or lease.poller is not None:
            return  # unknown (expired, or never lent): its SHMDONE is refused
        if lease.incoming is None:  # a spare: GO names its message
            self.leases.announce(lease, key, header)
        try:
            lease.nparts = int(nparts)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            lease.nparts = 0
        lease.reply_to = reply_to
        lease.poller = asyncio.ensure_future(self._poll(xid, lease))
        self.purge_later()  # a sender that stops half-way: its message fails when the lease expires


    async def done(self, xid: str, nparts: int) -> list[bytes]:
        """SHMDONE [xid, parts]: the sender wrote every part and saw no answer in time; answer here."""
        lease = self.leases.open.get(xid)
        if lease is not None and lease.poller is not None and not lease.poller.done():
            await asyncio.shield(lease.poller)
        if xid in self.leases.answered:
            return self.leases.answered.pop(xid)[1]
        lease = self.leases.open.get(xid)
        if lease is None or lease.incoming is None:
            return [b"ERR", b"unknown or expired shared-memory lease"]
        lease.nparts = lease.nparts or nparts  # (its GO was lost)
        lease.rung = lease.nparts  # everything was written before SHMDONE was sent
        await lease.check()
        return self._close(xid, lease)


    async def _poll(self, xid: str, lease: Lease) -> None:
        """Check parts as the sender publishes them; answer once all are in. Between parts it polls for
        ``POLL_SPIN_S``, then sleeps until the sender's next ring (a shared core goes to the sender);
        it stops after ``POLL_IDLE_S`` without a new part (DONE or SHMDONE then finishes), so an idle
        receiver never spins."""
        loop = asyncio.get_running_loop()
        idle = time.monotonic()
        while lease.checked < lease.nparts:
            if await lease.check():
                idle = time.monotonic()
                continue
            if lease.spare is None:  # waiting for the sender: lend the next spare now, off the critical path
                lease.spare = self.leases.lend(None, lease.seg.size)
                continue
            waited = time.monotonic() - idle
            if waited > POLL_IDLE_S or xid not in self.leases.open:
                return
            if waited < POLL_SPIN_S:
                await pause()
                continue
            lease.wake = wake = loop.create_future()
            lease.ctrl.sleeping(True)  # before the last look: a part published after it is rung
            if lease.published() > lease.checked:  # published while the ring was being set up
                lease.ctrl.sleeping(False)
                lease.wake = None
                continue
            timer = loop.call_later(POLL_IDLE_S - waited, wake.cancel)
            try:
                await wake
            except asyncio.CancelledError:
                if not wake.cancelled():
                    raise
            finally:
                timer.cancel()
                lease.ctrl.sleeping(False)
                lease.wake = None
        if xid in self.leases.open:
            self._close(xid, lease)


    def _close(self, xid: str, lease: Lease) -> list[bytes]:
        """Deliver the message (or its damage) and answer: in the control block, rung at the sender."""
        assert lease.incoming is not None
        self.t.stats["shm_received"] += 1
        reply = self.t.finish(lease.incoming)
        if reply == [b"OK"]:
            reply = reply + (lease.spare if lease.spare is not None else self.leases.lend(None, lease.seg.size))
        elif lease.spare:
            self.leases.drop(lease.spare[1].decode())
        self.leases.answer(xid, reply)
        if lease.reply_to:
            self.bell.ring(lease.reply_to, b"A" + xid.encode())
        return reply
