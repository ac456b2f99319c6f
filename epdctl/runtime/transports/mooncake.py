"""Mooncake transfer-engine transport: bulk bytes go through Mooncake (RDMA in production, TCP
here), a small ZMQ control channel negotiates where they land and confirms them.

Protocol for one ``send``: ALLOC (header with the tensor table) -> the receiver registers a
buffer laid out by ``wire.layout`` and answers its Mooncake session and address; the sender
copies the tensors into one staging buffer with the same layout and writes it in one transfer
(one large write beats one slice per tensor: a KV message has dozens of tensors);
DONE (lengths written) -> the receiver checks lengths and checksums, answers OK/ERR and hands out
tensors that are views into the received buffer (no second copy). An ALLOC never followed by
DONE is freed after the timeout.

Mooncake's engine listens on 0.0.0.0 on random ports even when given 127.0.0.1 (its P2P
handshake and TCP data ports); only the control channel binds where it is told. Firewalls must
allow that. ``metadata_server="P2PHANDSHAKE"`` needs no metadata service.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from typing import Protocol, Sequence

import numpy as np
import torch

from ..errors import TransferError
from ..wire import Frame, fill, layout, pack, parse_header, unpack_written
from .base import DEFAULT_TIMEOUT, Endpoint, advertised_host, verify

log = logging.getLogger(__name__)
os.environ.setdefault("GLOG_minloglevel", "1")  # Mooncake's INFO lines would flood worker logs


class _Engine(Protocol):
    """The part of ``mooncake.engine.TransferEngine`` (0.3.13, its pybind signatures) used here."""

    def initialize(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str, /) -> int: ...

    def get_rpc_port(self) -> int: ...

    def register_memory(self, buffer_addr: int, capacity: int) -> int: ...

    def unregister_memory(self, buffer_addr: int, /) -> int: ...

    def transfer_sync_write(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                            length: int) -> int: ...


def _ptr(buf: Frame) -> tuple[int, int]:
    arr = np.frombuffer(buf, dtype=np.uint8)
    return arr.ctypes.data, arr.nbytes


class MooncakeTransport(Endpoint):
    def __init__(self, host: str, *, port: int = 0, ib_device: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT):
        super().__init__(f"tcp://{host}:{port}" if port else f"tcp://{host}", timeout)
        self.host = host
        self.ib_device = ib_device
        self.engine: _Engine | None = None
        self.session = ""
        self._pending: dict[str, tuple[float, str, bytes, torch.Tensor]] = {}

    @property
    def address(self) -> str:
        return "mooncake://" + self.endpoint.removeprefix("tcp://")

    def _live(self) -> _Engine:
        """The engine; TransferError before ``start()`` or after ``close()`` (a send racing close)."""
        if self.engine is None:
            raise TransferError("transport mooncake: not started (or already closed)")
        return self.engine

    async def start(self) -> None:
        try:
            from mooncake.engine import TransferEngine
        except ImportError as exc:
            raise TransferError(f"transport mooncake: cannot import mooncake ({exc}); install "
                                "mooncake-transfer-engine (and libibverbs1) or use --transport zmq") from exc
        engine: _Engine = TransferEngine()
        protocol = "rdma" if self.ib_device else "tcp"
        local = advertised_host(self.host)
        rc = engine.initialize(local, "P2PHANDSHAKE", protocol, self.ib_device or "")
        if rc != 0:
            raise TransferError(f"transport mooncake: initialize({self.host}, {protocol}, "
                                f"device={self.ib_device or '-'}) failed with code {rc}")
        self.engine = engine
        self.session = f"{local}:{engine.get_rpc_port()}"
        await self._bind()

    async def send(self, peer: str, key: str, meta: dict, tensors: dict[str, torch.Tensor]) -> int:
        return await self.send_frames(peer, key, pack(meta, tensors))

    async def send_frames(self, peer: str, key: str, frames: Sequence[Frame]) -> int:
        """Send already-packed frames (tests use it to put damaged payloads through Mooncake)."""
        if not peer.startswith("mooncake://"):
            raise TransferError(f"peer {peer!r} is not a mooncake address (mooncake://host:port)")
        ctrl = "tcp://" + peer.removeprefix("mooncake://")
        header, bufs = bytes(frames[0]), list(frames[1:])
        try:
            reply = await self.request(ctrl, [b"ALLOC", key.encode(), header], f"send {key!r}")
            target = json.loads(reply[1])
            lengths = await asyncio.to_thread(self._write, target["session"], int(target["addr"]), header, bufs)
            await self.request(ctrl, [b"DONE", reply[2], json.dumps({"lengths": lengths}).encode()],
                               f"send {key!r}")
        except TransferError:
            self.stats["failures"] += 1
            raise
        nbytes = sum(lengths)
        self.stats["bytes_sent"] += nbytes
        self.stats["transfers_sent"] += 1
        return nbytes

    def _write(self, session: str, base: int, header: bytes, bufs: Sequence[Frame]) -> list[int]:
        total = layout(parse_header(header)["tensors"])[1]
        staging = torch.empty(max(total, 1), dtype=torch.uint8)
        lengths = fill(header, bufs, staging.numpy())
        ptr, engine = staging.data_ptr(), self._live()
        if engine.register_memory(ptr, staging.numel()) != 0:
            raise TransferError(f"mooncake: cannot register {staging.numel()} bytes of send buffer")
        try:
            rc = engine.transfer_sync_write(session, ptr, base, total) if total else 0
            if rc != 0:
                raise TransferError(f"mooncake: write of {total} bytes to {session} failed with code {rc}")
        finally:
            engine.unregister_memory(ptr)
        return lengths

    def _purge(self) -> None:
        now = time.monotonic()
        for xid in [x for x, p in self._pending.items() if now - p[0] > self.timeout]:
            _, key, _, buf = self._pending.pop(xid)
            self._live().unregister_memory(buf.data_ptr())
            self._deliver(key, TransferError(f"transfer {key!r}: sender announced data but never completed it"))

    async def _handle(self, frames: list[memoryview]) -> list[bytes]:
        kind = bytes(frames[0]) if frames else b""
        self._purge()
        if kind == b"ALLOC" and len(frames) == 3:
            key, header = bytes(frames[1]).decode(), bytes(frames[2])
            try:
                total = layout(parse_header(header)["tensors"])[1]
            except (TransferError, KeyError, ValueError) as exc:
                self._deliver(key, exc if isinstance(exc, TransferError) else TransferError(f"bad header: {exc}"))
                return [b"ERR", str(exc).encode()]
            buf = torch.empty(max(total, 1), dtype=torch.uint8)
            if self._live().register_memory(buf.data_ptr(), buf.numel()) != 0:
                return [b"ERR", b"receiver cannot register memory"]
            xid = uuid.uuid4().hex
            self._pending[xid] = (time.monotonic(), key, header, buf)
            target = {"session": self.session, "addr": buf.data_ptr()}
            return [b"OK", json.dumps(target).encode(), xid.encode()]
        if kind == b"DONE" and len(frames) == 3:
            entry = self._pending.pop(bytes(frames[1]).decode(), None)
            if entry is None:
                return [b"ERR", b"unknown or expired transfer id"]
            _, key, header, buf = entry
            self._live().unregister_memory(buf.data_ptr())
            lengths = json.loads(bytes(frames[2]))["lengths"]
            nbytes = sum(lengths)
            self.stats["bytes_received"] += nbytes
            try:
                result = await verify(self._unpack, (header, buf, lengths), nbytes)
            except TransferError as exc:
                self._deliver(key, exc)
                return [b"ERR", str(exc).encode()]
            self._deliver(key, result)
            return [b"OK"]
        return [b"ERR", b"unknown message"]

    @staticmethod
    def _unpack(args: tuple[bytes, torch.Tensor, list[int]]) -> tuple[dict, dict[str, torch.Tensor]]:
        return unpack_written(*args)

    async def close(self) -> None:
        if self.engine is not None:  # entries exist only once started
            for _, _, _, buf in self._pending.values():
                self.engine.unregister_memory(buf.data_ptr())
        self._pending.clear()
        await super().close()
        self.engine = None
