"""ZMQ transport (default): wire messages over tcp:// or ipc://, or through shared memory.

Either way a message is one contiguous buffer laid out by ``wire.layout``, cut into parts of a
few MiB at tensor boundaries (``parts.py``): the sender copies and hashes part i+1 while part i
travels, the receiver checks part i while part i+1 arrives. On the socket a part is a PART
message (one zero-copy frame out of a pool of reused send buffers) and END closes the message;
a one-part message is a single BLOB. A message of 256 KiB or more to a peer on this host goes
through a segment of /dev/shm the receiver lends instead (SHM -> SHMPART per part written ->
SHMEND; see shm.py), whether the peer shares the host being found out by the first such lease
and remembered. Receivers hand out views into the received buffer; the closing message is
answered only after every part checked out, so ``send()`` returning means delivered.
"""

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
from .parts import PART_BYTES, FrameWriter, Incoming, TensorWriter, Writer, part_header, span, split

log = logging.getLogger(__name__)
ZERO_COPY_BYTES = 1 << 20   # smaller payloads are copied into the frame: pyzmq's zero-copy bookkeeping costs more
SHM_MIN_BYTES = 256 * 1024  # below this, one inline message beats the extra lease round trip
_THREAD_BYTES = 32 << 20    # copy + hash larger parts in a thread so the event loop keeps serving
DIRECT_BYTES = 256 * 1024   # tensors this large go on the socket from their own memory (no copy)


async def _write(write: Writer, dst: np.ndarray, first: int, last: int, nbytes: int) -> tuple[list[int], list[int]]:
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
        self._leases: dict[str, tuple[float, Incoming, shm.Segment, memoryview]] = {}
        self.part_bytes = PART_BYTES
        self.direct_bytes = DIRECT_BYTES
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
        """One BLOB: each large tensor a zero-copy frame of its own memory (hashed, not copied),
        runs of small ones copied and hashed into slices of a reused send buffer."""
        parts = split(msg.header["tensors"], msg.offsets, msg.total, self.part_bytes, self.direct_bytes)
        staging = self._staging.take(msg.total)
        descs, frames, lengths = [], [], []
        for first, last in parts:
            if last - first == 1 and msg.header["tensors"][first]["nbytes"] >= self.direct_bytes:
                frame, digest, n = msg.write.direct(first)
                sums, written = [digest], [n]
            else:
                start, end = span(msg.offsets, msg.total, first, last)
                sums, written = await _write(msg.write, staging, first, last, end - start)
                frame = memoryview(staging[start:end])
            descs.append(part_header(first, sums, written))
            frames.append(frame)
            lengths.extend(written)
        await self.request(peer[4:], [b"BLOB", msg.key.encode(), msg.header_json, json.dumps(descs).encode(), *frames],
                           f"send {msg.key!r}", copy=msg.total < ZERO_COPY_BYTES)
        self._staging.give(staging)  # acknowledged: every byte left this process; reuse it
        return lengths

    async def _send_shm(self, peer: str, msg: "_Outgoing") -> list[int] | None:
        """Lease a segment of the peer's and write the message into it part by part (SHMPART
        after each, so the receiver checks one while the next is written); the lengths written,
        or None when the peer is not on this host."""
        endpoint, what = peer[4:], f"send {msg.key!r}"
        reply = await self.request(endpoint, [b"SHM", msg.key.encode(), msg.header_json], what)
        if len(reply) < 3:  # the receiver has no shared memory to lend
            self._same_host[peer] = False
            return None
        name, xid = reply[1].decode(), reply[2]
        try:
            dst = self._maps.open(name, msg.total)
        except OSError:
            self._same_host[peer] = False
            await self.request(endpoint, [b"DROP", xid], what)
            return None
        self._same_host[peer] = True
        lengths: list[int] = []

        async def parts() -> AsyncIterator[list[Frame]]:
            for first, last in split(msg.header["tensors"], msg.offsets, msg.total, self.part_bytes):
                start, end = span(msg.offsets, msg.total, first, last)
                sums, written = await _write(msg.write, dst, first, last, end - start)
                lengths.extend(written)
                yield [b"SHMPART", xid, json.dumps(part_header(first, sums, written)).encode()]
        self.stats["shm_sent"] += 1
        await self.request(endpoint, [b"SHMEND", xid], what, before=parts())
        return lengths

    async def _handle(self, frames: list[memoryview]) -> list[bytes] | None:
        kind = bytes(frames[0]) if frames else b""
        self._purge()
        if kind == b"SHMPART" and len(frames) == 3:  # no answer: SHMEND is answered for the whole message
            lease = self._leases.get(bytes(frames[1]).decode())
            if lease is not None:
                await self._add(lease[1], [frames[2]], [lease[3]], whole=True)
            return None
        if kind == b"BLOB" and len(frames) >= 4:
            try:
                incoming = Incoming.open(bytes(frames[1]).decode(), parse_header(frames[2]))
            except (TransferError, KeyError, TypeError, ValueError) as exc:
                return [b"ERR", f"bad message header: {exc}".encode()]
            await self._add(incoming, frames[3], frames[4:], whole=False)
            return self._finish(incoming)
        if kind == b"SHM" and len(frames) == 3:
            return self._lease(bytes(frames[1]).decode(), bytes(frames[2]))
        if kind == b"SHMEND" and len(frames) == 2:
            lease = self._leases.pop(bytes(frames[1]).decode(), None)
            if lease is None:
                return [b"ERR", b"unknown or expired shared-memory lease"]
            self.stats["shm_received"] += 1
            return self._finish(lease[1])
        if kind == b"DROP" and len(frames) == 2:
            lease = self._leases.pop(bytes(frames[1]).decode(), None)
            if lease is not None:
                self._pool.drop(lease[2])
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

    def _lease(self, key: str, header: bytes) -> list[bytes]:
        if self._pool is None:
            return [b"OK"]  # no shared memory to lend: the sender uses the socket
        try:
            incoming = Incoming.open(key, parse_header(header))
            seg = self._pool.lease(incoming.total)
        except (TransferError, KeyError, ValueError, TypeError):
            return [b"OK"]  # let the socket copy bring the same header and fail loudly there
        except OSError:
            return [b"OK"]  # /dev/shm full or unusable: the socket
        xid = uuid.uuid4().hex
        self._leases[xid] = (time.monotonic(), incoming, seg, memoryview(self._pool.view(seg, seg.size).numpy()))
        return [b"OK", seg.name.encode(), xid.encode()]

    def _purge(self) -> None:
        now = time.monotonic()
        for xid in [x for x, lease in self._leases.items() if now - lease[0] > self.timeout]:
            self._pool.drop(self._leases.pop(xid)[2])

    async def close(self) -> None:
        await super().close()
        self._maps.close()
        for _, _, seg, _ in self._leases.values():
            seg.release()
        self._leases.clear()
        if self._pool is not None:
            self._pool.close()
        if self._ipc_path and os.path.exists(self._ipc_path):
            os.unlink(self._ipc_path)


class _Outgoing:
    """One message on its way out: its header (checksums travel with the parts), layout and writer."""

    def __init__(self, key: str, header: dict, offsets: list[int], total: int, write: Writer):
        self.key, self.header, self.header_json = key, header, json.dumps(header).encode()
        self.offsets, self.total, self.write = offsets, total, write
