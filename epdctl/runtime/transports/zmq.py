"""ZMQ transport (default): the whole wire message travels inline over tcp:// or ipc://.

Each ``send`` opens a short-lived DEALER to the peer's ROUTER and waits for its ``OK`` (sent
only after the receiver verified sizes and checksums), so concurrent sends never share state.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import Sequence

import torch

from ..errors import TransferError
from ..wire import Frame, pack, unpack
from .base import DEFAULT_TIMEOUT, Endpoint, verify


class ZmqTransport(Endpoint):
    def __init__(self, bind: str, timeout: float = DEFAULT_TIMEOUT):
        super().__init__(bind, timeout)
        self._ipc_path: str | None = None

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
        return await self.send_frames(peer, key, pack(meta, tensors))

    async def send_frames(self, peer: str, key: str, frames: Sequence[Frame]) -> int:
        """Send already-packed frames (tests use it to put damaged payloads on a real socket)."""
        if not peer.startswith("zmq+"):
            raise TransferError(f"peer {peer!r} is not a zmq address (zmq+tcp://... or zmq+ipc://...)")
        nbytes = sum(memoryview(f).nbytes for f in frames)
        try:
            await self.request(peer[4:], [b"DATA", key.encode(), *frames], f"send {key!r}")
        except TransferError:
            self.stats["failures"] += 1
            raise
        self.stats["bytes_sent"] += nbytes
        self.stats["transfers_sent"] += 1
        return nbytes

    async def _handle(self, frames: list[memoryview]) -> list[bytes]:
        if len(frames) < 2 or bytes(frames[0]) != b"DATA":
            return [b"ERR", b"unknown message"]
        key = bytes(frames[1]).decode()
        payload = frames[2:]
        nbytes = sum(f.nbytes for f in payload)
        self.stats["bytes_received"] += nbytes
        try:
            result = await verify(unpack, payload, nbytes)
        except TransferError as exc:
            self._deliver(key, exc)
            return [b"ERR", str(exc).encode()]
        self._deliver(key, result)
        return [b"OK"]

    async def close(self) -> None:
        await super().close()
        if self._ipc_path and os.path.exists(self._ipc_path):
            os.unlink(self._ipc_path)
