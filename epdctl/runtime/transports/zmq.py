"""ZMQ transport (default): wire messages over tcp:// or ipc://.

A message is laid out by ``wire.layout`` and cut at tensor boundaries into parts (``parts.py``),
each with one checksum over its tensors (``spans.py``) and the lengths written. On the socket
each part is its own message (BLOBPART, the first carrying the header; the last is BLOB,
answered), sent as soon as it is written, so the sender copies and hashes part k+1 while part k
is on the wire and the receiver checks it (``streams.py`` keeps the receiver's book). Small and
very large messages go as one BLOB of frames. A large tensor is a zero-copy part of its own
memory (hashed, not copied); runs of smaller ones are copied and hashed in one pass into slices
of a send buffer. Receivers hand out views into the received buffers; a message is answered only
after every part checked out, so ``send()`` returning means delivered, and damage fails both
ends. The fast path adds a shared-memory hand-off between workers on one host
(``fast/transports/shm_zmq.py``)."""

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
from .base import DEFAULT_TIMEOUT, Endpoint, verify
from .streams import Streams
from .parts import PART_BYTES, FrameWriter, Incoming, Sums, TensorWriter, Writer, part_header, span, split

log = logging.getLogger(__name__)
ZERO_COPY_BYTES = 1 << 20   # smaller payloads are copied into the frame: pyzmq's zero-copy bookkeeping costs more
_THREAD_BYTES = 32 << 20    # copy + hash larger parts in a thread so the event loop keeps serving
PIPELINE_BYTES = 32 << 20   # larger socket messages go as one message of LARGE_PART_BYTES frames (not pipelined)
PIPELINE_MIN_BYTES = 8 << 20  # smaller messages are one part: the extra messages cost more than the overlap saves
LARGE_PART_BYTES = 16 << 20
DIRECT_BYTES = 4 << 20      # tensors this large go on the socket from their own memory (smaller: a copy beats a zero-copy frame)


class ZmqTransport(Endpoint):
    def __init__(self, bind: str, timeout: float = DEFAULT_TIMEOUT):
        super().__init__(bind, timeout)
        self._ipc_path: str | None = None
        self._streams = Streams(timeout)
        self.part_bytes, self.direct_bytes = PART_BYTES, DIRECT_BYTES
        self.pipeline_bytes, self.large_part_bytes = PIPELINE_BYTES, LARGE_PART_BYTES
        self.pipeline_min_bytes = PIPELINE_MIN_BYTES

    @classmethod
    def ipc(cls, ipc_dir: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> "ZmqTransport":
        path = os.path.join(ipc_dir or tempfile.gettempdir(), f"epd-{uuid.uuid4().hex[:12]}.sock")
        t = cls(f"ipc://{path}", timeout)
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
        """Check the peer's address, lay the message out and send it (``_deliver_to``)."""
        if not peer.startswith("zmq+"):
            raise TransferError(f"peer {peer!r} is not a zmq address (zmq+tcp://... or zmq+ipc://...)")
        offsets, total = layout(header["tensors"])
        msg = Outgoing(key, header, offsets, total, writer(offsets, total))
        try:
            lengths = await self._deliver_to(peer, msg)
        except TransferError:
            self.stats["failures"] += 1
            raise
        sent = sum(n for n in lengths if n > 0)
        self.stats["bytes_sent"] += sent
        self.stats["transfers_sent"] += 1
        return sent

    async def _deliver_to(self, peer: str, msg: "Outgoing") -> list[int]:
        """Put ``msg`` on the socket; the lengths written."""
        return await self._send_socket(peer, msg)

    def _take_staging(self, nbytes: int) -> np.ndarray:
        """A private send buffer for one message (kept alive until the peer acknowledged it)."""
        return np.empty(max(nbytes, 1), dtype=np.uint8)

    def _give_staging(self, buf: np.ndarray) -> None:
        """The acknowledged message's send buffer is free again (the fast path reuses it)."""

    @staticmethod
    async def write_part(write: Writer, dst: np.ndarray, first: int, last: int,
                          nbytes: int) -> tuple[Sums, list[int]]:
        """Copy and hash one part (in a thread when it is large, so the event loop keeps serving)."""
        if nbytes >= _THREAD_BYTES:
            return await asyncio.to_thread(write, dst, first, last)
        return write(dst, first, last)

    async def _send_socket(self, peer: str, msg: "Outgoing") -> list[int]:
        """Parts of ~``part_bytes``, each its own message (BLOBPART; the last BLOB, answered) sent
        as soon as it is written: writing, wire and check overlap, each part still in cache. Over
        ``pipeline_bytes`` (no longer in cache) or under ``pipeline_min_bytes`` (the extra messages
        cost more than the overlap saves): ONE BLOB of <= 16 MiB frames, as measured best."""
        staging = self._take_staging(msg.total)
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
                    sums, written = await self.write_part(msg.write, staging, first, last, end - start)
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
        self._give_staging(staging)  # acknowledged: every byte left this process
        return lengths

    async def _handle(self, frames: list[memoryview]) -> list[bytes] | None:
        kind = bytes(frames[0]) if frames else b""
        self.purge()
        if kind in (b"BLOB", b"BLOBPART") and len(frames) >= 4:  # BLOB: the last part, answered
            incoming = self._streams.take(bytes(frames[1]).decode(errors="replace"), frames[2])
            await self._add(incoming, frames[3], frames[4:])
            if kind == b"BLOB":
                return self.finish(incoming)
            self._streams.keep(incoming)
            return None
        return [b"ERR", b"unknown message"]

    def purge(self) -> None:
        """Drop half-sent socket messages whose sender went quiet for longer than the timeout."""
        self._streams.purge()

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

    def finish(self, incoming: Incoming) -> list[bytes]:
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
        if self._ipc_path and os.path.exists(self._ipc_path):
            os.unlink(self._ipc_path)


class Outgoing:
    """One message on its way out: its header (checksums travel with the parts), layout and writer."""

    def __init__(self, key: str, header: dict, offsets: list[int], total: int, write: Writer):
        self.key, self.header, self.offsets, self.total, self.write = key, header, offsets, total, write
        self.lengths: list[int] = []  # what a shared-memory hand-off wrote (fast path)
        self.header_json = json.dumps(header).encode()


