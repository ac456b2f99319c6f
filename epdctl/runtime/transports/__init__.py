"""Transports that carry wire-format messages between workers (embeddings E->P, KV P->D).

Every transport has one receiving endpoint per worker (``address``) and answers each message
with an acknowledgement, so ``send()`` knows the peer got a complete, checksum-verified copy
and an unreachable peer becomes a ``TransferError`` after the timeout, not a hang.
"""

from __future__ import annotations

from typing import Literal, Protocol

import torch

from .base import DEFAULT_TIMEOUT


class Transport(Protocol):
    stats: dict[str, int]

    @property
    def address(self) -> str:
        """Where peers send to (``zmq+tcp://``, ``zmq+ipc://``, ``mooncake://``); known once started."""
        ...

    async def start(self) -> None: ...

    async def send(self, peer: str, key: str, meta: dict, tensors: dict[str, torch.Tensor]) -> int: ...

    async def recv(self, key: str, timeout: float) -> tuple[dict, dict[str, torch.Tensor]]: ...

    def discard(self, key: str) -> None: ...

    async def close(self) -> None: ...


def open_transport(kind: Literal["zmq", "zmq-ipc", "mooncake"], host: str, *, port: int = 0,
                   ib_device: str | None = None, ipc_dir: str | None = None,
                   timeout: float = DEFAULT_TIMEOUT, shm: bool = False) -> Transport:
    """Create (not yet started) the transport of ``kind`` listening on ``host``.

    ``port`` 0 picks a free port. ``zmq-ipc`` uses a unix socket in ``ipc_dir`` (same host only).
    ``timeout`` bounds how long ``send()`` waits for the peer's acknowledgement. ``shm`` (the fast
    path): zmq kinds hand large messages to peers on this host through shared memory (found out
    per peer, fast/transports/shm_zmq.py).
    """
    if kind in ("zmq", "zmq-tcp", "zmq-ipc"):
        from .zmq import ZmqTransport
        cls = ZmqTransport
        if shm:
            from ..fast.transports.shm_zmq import ShmZmqTransport
            cls = ShmZmqTransport
        if kind == "zmq-ipc":
            return cls.ipc(ipc_dir, timeout=timeout)
        return cls(f"tcp://{host}:{port}" if port else f"tcp://{host}", timeout=timeout)
    if kind == "mooncake":
        from .mooncake import MooncakeTransport
        return MooncakeTransport(host, port=port, ib_device=ib_device, timeout=timeout)
    raise ValueError(f"transport {kind!r}: choose zmq, zmq-ipc or mooncake")


__all__ = ["Transport", "open_transport", "DEFAULT_TIMEOUT"]
