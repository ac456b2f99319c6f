"""The zmq transport's same-host path: a message written into a /dev/shm segment the receiver
lends, announced by a doorbell and answered through the segment's control block.

Sender: take the spare segment the receiver lent with its last answer (else lease one: SHM on the
socket), ring GO at the receiver's doorbell (``doorbell.py``: the key, header, number of parts
and the sender's own doorbell; SHMGO on the socket when it cannot ring), write the message part
by part (copy and hash in one pass, ``parts.py``, with plain stores: the receiver reads the part
from the shared cache next; non-temporal stores measured slower on an idle host, 16 MiB
6.3-6.7 vs 6.6-9.3 GB/s alternated), publishing each part in the
control block (``progress.py``) and ringing P, then poll the block briefly for the answer and
sleep until the ACK ring (DONE first, in case the receiver stopped polling). Receiver: on GO, check part i while
part i+1 is written (polling briefly, then sleeping until the next P: it says so in the control
block, and the sender rings P only then, so a polling receiver's event loop is not woken once per
part; where stores may be reordered every part is rung), deliver the message (or
its damage), write the answer with the next spare (lent while it waited) and ring ACK. A
hand-off that found a spare puts no message on the ZMQ socket. Every wait is bounded: a poll
stops after ``POLL_IDLE_S`` without a new part (DONE restarts it), and a sender that gets no
answer in time asks on the socket (SHMDONE), which the receiver answers there.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING

import numpy as np

from ..errors import TransferError
from .base import verify
from .leases import Lease
from .parts import part_header, span, split
from .progress import (ACK_SPIN_S, CTRL_BYTES, MAX_PARTS, ORDERED, POLL_IDLE_S, POLL_SPIN_S, Control, ack_spin_s, fits,
                       pause, token_of)

if TYPE_CHECKING:
    from .zmq import ZmqTransport, _Outgoing

Spare = tuple[str, bytes, int, float, str]  # a lent segment: name, lease id, size, when, the receiver's doorbell


class SpareGone(Exception):
    """The spare segment a peer lent is no longer there; lease a fresh one."""


async def send(t: "ZmqTransport", peer: str, msg: "_Outgoing") -> list[int] | None:
    """Hand ``msg`` over through shared memory: the lengths written, or None when the peer is not
    on this host (or the message does not suit the path): the caller then uses the socket."""
    size = t.part_bytes if msg.total >= t.pipeline_min_bytes else t.large_part_bytes
    cuts = split(msg.header["tensors"], msg.offsets, msg.total, max(size, -(-msg.total // MAX_PARTS)))
    if cuts[-1][1] - cuts[-1][0] > 1:  # the last tensor a part of its own: the receiver's check trails by less
        first, last = cuts.pop()
        cuts += [(first, last - 1), (last - 1, last)]
    if not fits(len(msg.header["tensors"]), len(cuts)):
        return None
    spare = t._spares.pop(peer, None)
    if spare is not None and spare[2] >= msg.total + CTRL_BYTES and time.monotonic() - spare[3] < t.timeout / 2:
        try:
            return await _write(t, peer, msg, cuts, spare, spare=True)
        except SpareGone:
            pass  # purged, or the receiver restarted: lease one now
    reply = await t.request(peer[4:], [b"SHM", msg.key.encode(), msg.header_json], f"send {msg.key!r}")
    if len(reply) < 4:  # the receiver has no shared memory to lend
        t._same_host[peer] = False
        return None
    return await _write(t, peer, msg, cuts, lent(reply), spare=False)


def lent(reply: list[bytes]) -> Spare:
    """The segment in an answer [OK, name, xid, size, doorbell]."""
    return reply[1].decode(), reply[2], int(reply[3]), time.monotonic(), reply[4].decode() if len(reply) > 4 else ""


async def _write(t: "ZmqTransport", peer: str, msg: "_Outgoing", cuts: list[tuple[int, int]], seg: Spare,
                 spare: bool) -> list[int] | None:
    endpoint, what = peer[4:], f"send {msg.key!r}"
    name, xid, size = seg[0], seg[1], seg[2]
    try:
        whole = t._maps.open(name, size)
    except (OSError, ValueError):
        if spare:
            raise SpareGone() from None
        t._same_host[peer] = False
        await t.request(endpoint, [b"DROP", xid], what)
        return None
    ctrl = Control(whole[size - CTRL_BYTES:])
    if not ctrl.claim(token_of(xid.decode())):
        if spare:
            raise SpareGone()
        raise TransferError(f"{what}: the segment {peer} lent was taken back before it was written")
    t._same_host[peer] = True
    try:
        reply = await _hand_over(t, endpoint, msg, cuts, ctrl, whole, xid, seg[4])
    except TransferError as exc:
        if spare and "unknown or expired" in str(exc):
            raise SpareGone() from exc
        t.stats["shm_sent"] += 1
        raise
    t.stats["shm_sent"] += 1
    if len(reply) >= 4:  # a spare segment for the next message
        t._spares[peer] = lent(reply)
    return msg.lengths


async def _hand_over(t: "ZmqTransport", endpoint: str, msg: "_Outgoing", cuts: list[tuple[int, int]], ctrl: Control,
                     whole: np.ndarray, xid: bytes, bell: str) -> list[bytes]:
    """GO, the parts written and published one by one, DONE, then the answer (rung, else asked for)."""
    what = f"send {msg.key!r}"
    go_msg = b"G" + json.dumps([xid.decode(), msg.key, len(cuts), t._bell.address]).encode() + b"\0" + msg.header_json
    rung = bool(bell) and t._bell.ring(bell, go_msg)
    if not rung:
        await t.post(endpoint, [b"SHMGO", xid, msg.key.encode(), msg.header_json, str(len(cuts)).encode()], what)
    acked = asyncio.get_running_loop().create_future()
    t._acks[xid.decode()] = acked
    try:
        msg.lengths = []
        for i, (first, last) in enumerate(cuts):
            start, end = span(msg.offsets, msg.total, first, last)
            sums, written = await t._write_part(msg.write, whole, first, last, end - start)
            msg.lengths.extend(written)
            ctrl.publish(i, part_header(first, sums, written))
            if rung and (not ORDERED or ctrl.asleep()):  # a receiver that polls needs no ring
                t._bell.ring(bell, b"P%s %d" % (xid, i + 1))
        # the receiver trails by about one part: poll for its answer a little, then sleep until it rings
        reply = await ctrl.wait_reply(ACK_SPIN_S if rung else ack_spin_s(msg.total)) if ORDERED else None
        if reply is None and rung:
            t._bell.ring(bell, b"D%s %d" % (xid, len(cuts)))  # (restarts the receiver's poll if it had stopped)
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
        t._acks.pop(xid.decode(), None)
    if reply is None:  # the receiver is not polling (asleep, slow or gone): ask on the socket
        return await t.request(endpoint, [b"SHMDONE", xid, str(len(cuts)).encode()], what)
    if reply[0] != b"OK":
        detail = reply[1].decode(errors="replace") if len(reply) > 1 else "no detail"
        raise TransferError(f"{what}: peer {endpoint} rejected the transfer: {detail}")
    return reply


def ring(t: "ZmqTransport", data: bytes) -> None:
    """A doorbell ring: G (a sender starts writing), P (it published a part), D (it wrote every
    part), A (our answer is in)."""
    kind, body = data[:1], data[1:]
    if kind == b"A":
        acked = t._acks.get(body.decode(errors="replace"))
        if acked is not None and not acked.done():
            acked.set_result(None)
    elif kind == b"G":
        head, _, header = body.partition(b"\0")
        xid, key, nparts, reply_to = json.loads(head)
        go(t, str(xid), str(key), header, nparts, str(reply_to))
    elif kind in (b"P", b"D"):  # [xid, parts published so far]
        xid, _, count = body.decode(errors="replace").partition(" ")
        lease = t._leases.open.get(xid)
        if lease is None or not count.isdigit():
            return
        lease.rung = max(lease.rung, int(count))
        if lease.wake is not None and not lease.wake.done():
            lease.wake.set_result(None)
        elif kind == b"D" and lease.poller is not None and lease.poller.done():  # it stopped polling
            lease.poller = asyncio.ensure_future(_poll(t, xid, lease))


def go(t: "ZmqTransport", xid: str, key: str, header: bytes | memoryview, nparts: object, reply_to: str = "") -> None:
    """The sender starts writing into the lease ``xid`` (GO or SHMGO): poll it."""
    lease = t._leases.open.get(xid)
    if lease is None or lease.poller is not None:
        return  # unknown (expired, or never lent): its SHMDONE is refused
    if lease.incoming is None:  # a spare: GO names its message
        t._leases.announce(lease, key, header)
    try:
        lease.nparts = int(nparts)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        lease.nparts = 0
    lease.reply_to = reply_to
    lease.poller = asyncio.ensure_future(_poll(t, xid, lease))
    t._purge_later()  # a sender that stops half-way: its message fails when the lease expires


async def done(t: "ZmqTransport", xid: str, nparts: int) -> list[bytes]:
    """SHMDONE [xid, parts]: the sender wrote every part and saw no answer in time; answer here."""
    lease = t._leases.open.get(xid)
    if lease is not None and lease.poller is not None and not lease.poller.done():
        await asyncio.shield(lease.poller)
    if xid in t._leases.answered:
        return t._leases.answered.pop(xid)[1]
    lease = t._leases.open.get(xid)
    if lease is None or lease.incoming is None:
        return [b"ERR", b"unknown or expired shared-memory lease"]
    lease.nparts = lease.nparts or nparts  # (its GO was lost)
    lease.rung = lease.nparts  # everything was written before SHMDONE was sent
    await _check(lease)
    return _close(t, xid, lease)


async def _poll(t: "ZmqTransport", xid: str, lease: Lease) -> None:
    """Check parts as the sender publishes them; answer once all are in. Between parts it polls for
    ``POLL_SPIN_S``, then sleeps until the sender's next ring (a shared core goes to the sender);
    it stops after ``POLL_IDLE_S`` without a new part (DONE or SHMDONE then finishes), so an idle
    receiver never spins."""
    loop = asyncio.get_running_loop()
    idle = time.monotonic()
    while lease.checked < lease.nparts:
        if await _check(lease):
            idle = time.monotonic()
            continue
        if lease.spare is None:  # waiting for the sender: lend the next spare now, off the critical path
            lease.spare = t._leases.lend(None, lease.seg.size)
            continue
        waited = time.monotonic() - idle
        if waited > POLL_IDLE_S or xid not in t._leases.open:
            return
        if waited < POLL_SPIN_S:
            await pause()
            continue
        lease.wake = wake = loop.create_future()
        lease.ctrl.sleeping(True)  # before the last look: a part published after it is rung
        if _published(lease) > lease.checked:  # published while the ring was being set up
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
    if xid in t._leases.open:
        _close(t, xid, lease)


def _published(lease: Lease) -> int:
    """Parts the sender published: read from the block where stores stay in order (x86), else only
    what its rings said (a datagram orders memory between the two processes)."""
    return lease.ctrl.progress() if ORDERED else lease.rung


async def _check(lease: Lease) -> bool:
    """Check the parts published since the last look; whether there were any."""
    assert lease.incoming is not None
    incoming, ctrl = lease.incoming, lease.ctrl
    first, last = lease.checked, min(_published(lease), lease.nparts)
    if last <= first:
        return False
    lease.checked = last
    try:
        parts = [ctrl.part(i) for i in range(first, last)]

        def check(_: object) -> None:
            for part in parts:
                incoming.add(part, lease.buf, whole=True)
        await verify(check, None, sum(incoming.size_of(p) for p in parts))
    except (ValueError, KeyError, TypeError) as exc:  # (a JSONDecodeError is a ValueError)
        incoming.error = incoming.error or TransferError(f"malformed part of {incoming.key!r}: {exc}")
    return True


def _close(t: "ZmqTransport", xid: str, lease: Lease) -> list[bytes]:
    """Deliver the message (or its damage) and answer: in the control block, rung at the sender."""
    assert lease.incoming is not None
    t.stats["shm_received"] += 1
    reply = t._finish(lease.incoming)
    if reply == [b"OK"]:
        reply = reply + (lease.spare if lease.spare is not None else t._leases.lend(None, lease.seg.size))
    elif lease.spare:
        t._leases.drop(lease.spare[1].decode())
    t._leases.answer(xid, reply)
    if lease.reply_to:
        t._bell.ring(lease.reply_to, b"A" + xid.encode())
    return reply
