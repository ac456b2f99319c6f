"""ZMQ transport (default): wire messages over tcp:// or ipc://, or through shared memory.

A message is laid out by ``wire.layout`` and cut at tensor boundaries into parts of ~2 MiB
(``parts.py``), each with one checksum over its tensors (``spans.py``) and the lengths written.
On the socket each part is its own message (BLOBPART, the first carrying the header; the last is
BLOB, answered), sent as soon as it is written: the sender copies and hashes part k+1 while part
k is on the wire and the receiver checks it, each part still in cache when the next stage reads
it (``streams.py`` keeps the receiver's book); a message under 8 MiB or over 32 MiB goes as one
BLOB of <= 16 MiB frames, and one under 8 MiB is one part in shared memory too. A tensor of 4 MiB or more is a zero-copy part of
its own memory (hashed, not copied); runs of smaller ones are copied and hashed in one pass into
slices of a reused send buffer. A message of 256 KiB or more to a peer on this host goes through
a segment of /dev/shm the receiver lends instead (leases.py), in the same parts: SHMPART after
each so the receiver checks it while the next is written, the last part riding on SHMEND. Each
answer to SHMEND lends a spare segment, so the next hand-off needs no lease round trip (SHM ->
lease -> SHMEND when no spare fits). Whether a peer shares the host is found out by the first
lease and remembered. Receivers hand out views into the received buffers; a message is answered
only after every part checked out, so ``send()`` returning means delivered, and damage fails
both ends."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
import time
import uuid
from typing import AsyncIterator, Callable, Sequence

import numpy as np
import torch

from ..errors import TransferError
from ..wire import Frame, describe, layout, parse_header
from . import shm
from .base import DEFAULT_TIMEOUT, Endpoint, verify
from .leases import Leases
from .streams import Streams
from .parts import PART_BYTES, FrameWriter, Incoming, Sums, TensorWriter, Writer, part_header, span, split

log = logging.getLogger(__name__)
ZERO_COPY_BYTES = 1 << 20   # smaller payloads are copied into the frame: pyzmq's zero-copy bookkeeping costs more
SHM_MIN_BYTES = 256 * 1024  # below this, one inline message beats the extra lease round trip
_THREAD_BYTES = 32 << 20    # copy + hash larger parts in a thread so the event loop keeps serving
PIPELINE_BYTES = 32 << 20   # larger socket messages go as one message of LARGE_PART_BYTES frames (not pipelined)
PIPELINE_MIN_BYTES = 8 << 20  # smaller messages are one part: the extra messages cost more than the overlap saves
LARGE_PART_BYTES = 16 << 20
DIRECT_BYTES = 4 << 20      # tensors this large go on the socket from their own memory (smaller: a copy beats a zero-copy frame)


async def _write(write: Writer, dst: np.ndarray, first: int, last: int, nbytes: int) -> tuple[Sums, list[int]]:
    if nbytes >= _THREAD_BYTES:
        return await asyncio.to_thread(write, dst, first, last)
    return write(dst, first, last)


class ZmqTransport(Endpoint):
    def __init__(self, bind: str, timeout: float = DEFAULT_TIMEOUT, use_shm: bool = True):
        super().__init__(bind, timeout)
        self._ipc_path: str | None = None
        self.use_shm = use_shm and shm.available()
        self._pool: shm.SegmentPool | None = None
        if self.use_shm:
            try:
                self._pool = shm.SegmentPool()
            except OSError:  # /dev/shm not writable after all: sockets only
                self.use_shm = False
        self.shm_min_bytes = SHM_MIN_BYTES
        self._staging = shm.BufferPool()
        self._maps = shm.SenderMaps()
        self._same_host: dict[str, bool] = {}
        self._leases = Leases(self._pool, timeout)
        self._streams = Streams(timeout)
        self._spares: dict[str, tuple[str, bytes, int, float]] = {}  # peer -> segment it lent for the next message
        self.part_bytes, self.direct_bytes = PART_BYTES, DIRECT_BYTES
        self.pipeline_bytes, self.large_part_bytes = PIPELINE_BYTES, LARGE_PART_BYTES
        self.pipeline_min_bytes = PIPELINE_MIN_BYTES
        self.stats.update({"shm_sent": 0, "shm_received": 0})

    @classmethod
    def ipc(cls, ipc_dir: str | None = None, timeout: float = DEFAULT_TIMEOUT, use_shm: bool = True) -> "ZmqTransport":
        path = os.path.join(ipc_dir or tempfile.gettempdir(), f"epd-{uuid.uuid4().hex[:12]}.sock")
        t = cls(f"ipc://{path}", timeout, use_shm)
        t._ipc_path = path
        return t

    @property
    def address(self) -> str:
        return "zmq+" + self.endpoint

    async def start(self) -> None:
        await self._bind()

    async def send(self, peer: str, key: str, meta: dict, tensors: dict[str, torch.Tensor]) -> int:
        header, bufs = describe(meta, tensors)
        return await self._send(peer, key, header, lambda offsets, _: TensorWriter(header["tensors"], bufs, offsets))

    async def send_frames(self, peer: str, key: str, frames: Sequence[Frame]) -> int:
        """Send already-packed frames (tests use it to put damaged payloads on a real socket)."""
        header = parse_header(frames[0])
        return await self._send(peer, key, header,
                                lambda offsets, total: FrameWriter(header["tensors"], frames[1:], offsets, total))

    async def _send(self, peer: str, key: str, header: dict, writer: Callable[[list[int], int], Writer]) -> int:
        """Through shared memory when the peer is on this host, else on the socket."""
        if not peer.startswith("zmq+"):
            raise TransferError(f"peer {peer!r} is not a zmq address (zmq+tcp://... or zmq+ipc://...)")
        offsets, total = layout(header["tensors"])
        msg = _Outgoing(key, header, offsets, total, writer(offsets, total))
        try:
            shm_ok = self.use_shm and total >= self.shm_min_bytes and self._same_host.get(peer, True)
            lengths = await self._send_shm(peer, msg) if shm_ok else None
            if lengths is None:
                lengths = await self._send_socket(peer, msg)
        except TransferError:
            self.stats["failures"] += 1
            raise
        sent = sum(n for n in lengths if n > 0)
        self.stats["bytes_sent"] += sent
        self.stats["transfers_sent"] += 1
        return sent

    async def _send_socket(self, peer: str, msg: "_Outgoing") -> list[int]:
        """Parts of ~``part_bytes``, each its own message (BLOBPART; the last BLOB, answered) sent
        as soon as it is written: writing, wire and check overlap, each part still in cache. Over
        ``pipeline_bytes`` (no longer in cache) or under ``pipeline_min_bytes`` (the extra messages
        cost more than the overlap saves): ONE BLOB of <= 16 MiB frames, as measured best."""
        staging = self._staging.take(msg.total)
        lengths: list[int] = []
        table = msg.header["tensors"]
        if not self.pipeline_min_bytes <= msg.total <= self.pipeline_bytes:
            groups = [split(table, msg.offsets, msg.total, self.large_part_bytes, self.direct_bytes)]
        else:
            groups = [[part] for part in split(table, msg.offsets, msg.total, self.part_bytes, self.direct_bytes)]

        async def blob(i: int) -> list[Frame]:
            descs, frames = [], []
            sums: Sums  # a direct tensor's one checksum, or what the writer hashed
            written: list[int]
            for first, last in groups[i]:
                if last - first == 1 and table[first]["nbytes"] >= self.direct_bytes:
                    frame, digest, n = msg.write.direct(first)  # its own memory, hashed, not copied
                    sums, written = digest, [n]  # a part of one tensor: its span is its bytes
                else:  # a run of small tensors, copied and hashed into a slice of the send buffer
                    start, end = span(msg.offsets, msg.total, first, last)
                    sums, written = await _write(msg.write, staging, first, last, end - start)
                    frame = staging[start:end].data  # its memoryview
                lengths.extend(written)
                descs.append(part_header(first, sums, written))
                frames.append(frame)
            return [b"BLOB" if i == len(groups) - 1 else b"BLOBPART", msg.key.encode(),
                    msg.header_json if i == 0 else b"", json.dumps(descs).encode(), *frames]

        async def blobs() -> AsyncIterator[list[Frame]]:
            for i in range(len(groups)):
                yield await blob(i)
        what, copy = f"send {msg.key!r}", msg.total < ZERO_COPY_BYTES
        if len(groups) == 1:  # one message: no generator to drive
            await self.request(peer[4:], await blob(0), what, copy=copy)
        else:
            await self.request(peer[4:], None, what, copy=copy, stream=blobs())
        self._staging.give(staging)  # acknowledged: every byte left this process; reuse it
        return lengths

    async def _send_shm(self, peer: str, msg: "_Outgoing") -> list[int] | None:
        """Write the message into a segment the peer lent, part by part (SHMPART after each, so the
        receiver checks one while the next is written), then SHMEND. The segment is the spare the
        peer lent with its last answer when that fits (no lease round trip), else one leased now.
        The lengths written, or None when the peer is not on this host."""
        endpoint, what = peer[4:], f"send {msg.key!r}"
        spare = self._spares.pop(peer, None)
        if spare is not None and spare[2] >= msg.total and time.monotonic() - spare[3] < self.timeout / 2:
            try:
                return await self._write_shm(peer, msg, spare[0], spare[1], spare=True)
            except _SpareGone:
                pass  # purged, or the receiver restarted: lease one now
        reply = await self.request(endpoint, [b"SHM", msg.key.encode(), msg.header_json], what)
        if len(reply) < 3:  # the receiver has no shared memory to lend
            self._same_host[peer] = False
            return None
        return await self._write_shm(peer, msg, reply[1].decode(), reply[2], spare=False)

    async def _write_shm(self, peer: str, msg: "_Outgoing", name: str, xid: bytes, spare: bool) -> list[int] | None:
        endpoint, what = peer[4:], f"send {msg.key!r}"
        try:
            dst = self._maps.open(name, msg.total)
        except OSError:
            if spare:
                raise _SpareGone() from None
            self._same_host[peer] = False
            await self.request(endpoint, [b"DROP", xid], what)
            return None
        self._same_host[peer] = True
        lengths: list[int] = []

        async def parts() -> AsyncIterator[list[Frame]]:
            size = self.part_bytes if msg.total >= self.pipeline_min_bytes else self.large_part_bytes
            cuts = split(msg.header["tensors"], msg.offsets, msg.total, size)
            for i, (first, last) in enumerate(cuts):
                start, end = span(msg.offsets, msg.total, first, last)
                sums, written = await _write(msg.write, dst, first, last, end - start)
                lengths.extend(written)
                head = [msg.key.encode(), msg.header_json] if spare and i == 0 else []
                kind = b"SHMEND" if i == len(cuts) - 1 else b"SHMPART"  # the last part closes the message
                yield [kind, xid, json.dumps(part_header(first, sums, written)).encode(), *head]
        try:
            reply = await self.request(endpoint, None, what, stream=parts())
        except TransferError as exc:
            if spare and "unknown or expired" in str(exc):
                raise _SpareGone() from exc
            self.stats["shm_sent"] += 1
            raise
        self.stats["shm_sent"] += 1
        if len(reply) >= 4:  # a spare segment for the next message
            self._spares[peer] = (reply[1].decode(), reply[2], int(reply[3]), time.monotonic())
        return lengths

    async def _handle(self, frames: list[memoryview]) -> list[bytes] | None:
        kind = bytes(frames[0]) if frames else b""
        self._leases.purge()
        self._streams.purge()
        if kind in (b"SHMPART", b"SHMEND") and len(frames) in (3, 5):  # SHMEND: the last part, answered
            xid = bytes(frames[1]).decode()
            lease = self._leases.open.get(xid) if kind == b"SHMPART" else self._leases.open.pop(xid, None)
            if lease is not None and lease.incoming is None and len(frames) == 5:  # the first part into a spare
                self._leases.announce(lease, bytes(frames[3]).decode(), frames[4])
            if lease is not None and lease.incoming is not None:
                await self._add(lease.incoming, [frames[2]], [lease.buf], whole=True)
            if kind == b"SHMPART":
                return None
            if lease is None or lease.incoming is None:
                return [b"ERR", b"unknown or expired shared-memory lease"]
            self.stats["shm_received"] += 1
            reply = self._finish(lease.incoming)
            return reply + self._leases.lend(None, lease.seg.size) if reply == [b"OK"] else reply
        if kind in (b"BLOB", b"BLOBPART") and len(frames) >= 4:  # BLOB: the last part, answered
            incoming = self._streams.take(bytes(frames[1]).decode(errors="replace"), frames[2])
            await self._add(incoming, frames[3], frames[4:], whole=False)
            if kind == b"BLOB":
                return self._finish(incoming)
            self._streams.keep(incoming)
            return None
        if kind == b"SHM" and len(frames) == 3:
            return self._leases.for_message(bytes(frames[1]).decode(), bytes(frames[2]))
        if kind == b"DROP" and len(frames) == 2:
            self._leases.drop(bytes(frames[1]).decode())
            return [b"OK"]
        return [b"ERR", b"unknown message"]

    async def _add(self, incoming: Incoming, descs: Frame | list[Frame], bufs: list[memoryview], whole: bool) -> None:
        """Check parts (``descs``: their JSON headers, one list or one each) in ``bufs`` (one each,
        or the whole layout once); in a thread when they are large. Never raises: ``finish`` reports."""
        try:
            parts = json.loads(bytes(descs)) if not isinstance(descs, list) else [json.loads(bytes(d)) for d in descs]
            if not isinstance(parts, list) or (not whole and len(parts) != len(bufs)):
                raise TransferError(f"transfer of {incoming.key!r} truncated: {len(bufs)} buffers for "
                                    f"{len(parts) if isinstance(parts, list) else '?'} parts")

            def check(_: object) -> None:
                for i, part in enumerate(parts):
                    incoming.add(part, bufs[0 if whole else i], whole)
            await verify(check, None, sum(incoming.size_of(p) for p in parts))
        except Exception as exc:  # a part is never answered on its own: its message's end reports it
            if not isinstance(exc, TransferError):
                log.exception("transport endpoint: part of %r failed", incoming.key)
            incoming.error = incoming.error or (exc if isinstance(exc, TransferError)
                                                else TransferError(f"receiver failed: {exc}"))

    def _finish(self, incoming: Incoming) -> list[bytes]:
        """Deliver a whole message (or its error) to its ``recv`` and answer the sender."""
        self.stats["bytes_received"] += incoming.received
        try:
            result = incoming.finish()
        except TransferError as exc:
            self._deliver(incoming.key, exc)
            return [b"ERR", str(exc).encode()]
        self._deliver(incoming.key, result)
        return [b"OK"]

    async def close(self) -> None:
        await super().close()
        self._maps.close()
        self._leases.close()
        if self._pool is not None:
            self._pool.close()
        if self._ipc_path and os.path.exists(self._ipc_path):
            os.unlink(self._ipc_path)


class _Outgoing:
    """One message on its way out: its header (checksums travel with the parts), layout and writer."""

    def __init__(self, key: str, header: dict, offsets: list[int], total: int, write: Writer):
        self.key, self.header, self.offsets, self.total, self.write = key, header, offsets, total, write
        self.header_json = json.dumps(header).encode()


class _SpareGone(Exception):
    """The spare segment a peer lent is no longer there; lease a fresh one."""
