"""ZMQ transport (default): wire messages over tcp:// or ipc://, or through shared memory.

A message is laid out by ``wire.layout`` and cut at tensor boundaries into parts of ~2 MiB
(``parts.py``), each with one checksum over its tensors (``spans.py``) and the lengths written.
On the socket each part is its own message (BLOBPART, the first carrying the header; the last is
BLOB, answered), sent as soon as it is written: the sender copies and hashes part k+1 while part
k is on the wire and the receiver checks it, each part still in cache when the next stage reads
it (``streams.py`` keeps the receiver's book); a message under 8 MiB or over 32 MiB goes as one
BLOB of <= 16 MiB frames, and one under 8 MiB is one part in shared memory too. A tensor of 4
MiB or more is a zero-copy part of its own memory (hashed, not copied); runs of smaller ones are
copied and hashed in one pass into slices of a reused send buffer. A message of 256 KiB or more
to a peer on this host goes through a segment of /dev/shm the receiver lends instead, in the
same parts, announced by a doorbell and answered through the segment's control block
(``same_host.py``, ``progress.py``, ``doorbell.py``); each answer lends a spare segment, so the
next hand-off needs no lease round trip. Whether a peer shares the host is found out by the
first lease and remembered. Receivers hand out views into the received buffers; a message is
answered only after every part checked out, so ``send()`` returning means delivered, and damage
fails both ends."""

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
from . import heap, same_host, shm
from .base import DEFAULT_TIMEOUT, Endpoint, verify
from .doorbell import Doorbell
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
        self._spares: dict[str, same_host.Spare] = {}  # peer -> segment it lent for the next message
        self._bell = Doorbell(lambda data: same_host.ring(self, data))
        self._acks: dict[str, asyncio.Future[None]] = {}  # lease id -> rung when its answer is in
        self._purge_timer: asyncio.TimerHandle | None = None
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
        heap.keep_frames()  # received frames reuse heap memory (no page faults per message)
        await self._bind()
        if self.use_shm and self._bell.open():
            self._leases.bell = self._bell.address

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
            lengths = await same_host.send(self, peer, msg) if shm_ok else None
            if lengths is None:
                lengths = await self._send_socket(peer, msg)
        except TransferError:
            self.stats["failures"] += 1
            raise
        sent = sum(n for n in lengths if n > 0)
        self.stats["bytes_sent"] += sent
        self.stats["transfers_sent"] += 1
        return sent

    @staticmethod
    async def _write_part(write: Writer, dst: np.ndarray, first: int, last: int,
                          nbytes: int) -> tuple[Sums, list[int]]:
        """Copy and hash one part (in a thread when it is large, so the event loop keeps serving)."""
        if nbytes >= _THREAD_BYTES:
            return await asyncio.to_thread(write, dst, first, last)
        return write(dst, first, last)

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
                    sums, written = await self._write_part(msg.write, staging, first, last, end - start)
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

    async def _handle(self, frames: list[memoryview]) -> list[bytes] | None:
        kind = bytes(frames[0]) if frames else b""
        self._purge()
        if kind == b"SHMGO" and len(frames) == 5:  # the sender writes into a lent segment: poll it
            same_host.go(self, bytes(frames[1]).decode(errors="replace"), bytes(frames[2]).decode(errors="replace"),
                         frames[3], bytes(frames[4]).decode(errors="replace"))
            return None
        if kind == b"SHMDONE" and len(frames) == 3 and bytes(frames[2]).isdigit():
            return await same_host.done(self, bytes(frames[1]).decode(errors="replace"), int(bytes(frames[2])))
        if kind in (b"BLOB", b"BLOBPART") and len(frames) >= 4:  # BLOB: the last part, answered
            incoming = self._streams.take(bytes(frames[1]).decode(errors="replace"), frames[2])
            await self._add(incoming, frames[3], frames[4:])
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

    def _purge(self) -> None:
        """Drop expired leases and half-sent socket messages; a lease's message fails (truncated)."""
        for key, error in self._leases.purge():
            self._deliver(key, error)
        self._streams.purge()

    def _purge_later(self) -> None:
        """Purge once the timeout has passed (no message may come to trigger it), while leases are open."""
        def tick() -> None:
            self._purge_timer = None
            self._purge()
            if self._leases.open:
                self._purge_later()
        if self._purge_timer is None:
            self._purge_timer = asyncio.get_running_loop().call_later(self.timeout + 0.05, tick)

    async def _add(self, incoming: Incoming, descs: Frame, bufs: list[memoryview]) -> None:
        """Check parts (``descs``: their JSON headers) in ``bufs`` (one each); in a thread when they
        are large. Never raises: ``finish`` reports."""
        try:
            parts = json.loads(bytes(descs))
            if not isinstance(parts, list) or len(parts) != len(bufs):
                raise TransferError(f"transfer of {incoming.key!r} truncated: {len(bufs)} buffers for "
                                    f"{len(parts) if isinstance(parts, list) else '?'} parts")

            def check(_: object) -> None:
                for i, part in enumerate(parts):
                    incoming.add(part, bufs[i], whole=False)
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
        if self._purge_timer is not None:
            self._purge_timer.cancel()
        await super().close()
        self._bell.close()
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
        self.lengths: list[int] = []  # what the shared-memory path wrote
        self.header_json = json.dumps(header).encode()


