"""The zmq transport with a shared-memory hand-off between workers on one host.

A message of ``SHM_MIN_BYTES`` or more to a peer on this host goes through a segment of /dev/shm
the receiver lends instead of the socket, in the same parts (``same_host.py``); whether a peer
shares the host is found out by the first lease and remembered. Received frames reuse heap
memory (``heap.py``) and send buffers are reused once acknowledged (``shm.BufferPool``).
"""

from __future__ import annotations

import numpy as np

from ...transports.base import DEFAULT_TIMEOUT
from ...transports.zmq import Outgoing, ZmqTransport
from . import heap, shm
from .same_host import SameHost

SHM_MIN_BYTES = 256 * 1024  # below this, one inline message beats the extra lease round trip


class ShmZmqTransport(ZmqTransport):
    def __init__(self, bind: str, timeout: float = DEFAULT_TIMEOUT, use_shm: bool = True):
        super().__init__(bind, timeout)
        self.use_shm = use_shm and shm.available()
        pool: shm.SegmentPool | None = None
        if self.use_shm:
            try:
                pool = shm.SegmentPool()
            except OSError:  # /dev/shm not writable after all: sockets only
                self.use_shm = False
        self.shm = SameHost(self, pool)
        self.shm_min_bytes = SHM_MIN_BYTES
        self._staging = shm.BufferPool()
        self.stats.update({"shm_sent": 0, "shm_received": 0})

    async def start(self) -> None:
        heap.keep_frames()  # received frames reuse heap memory (no page faults per message)
        await super().start()
        if self.use_shm:
            self.shm.open()

    async def _deliver_to(self, peer: str, msg: Outgoing) -> list[int]:
        """Through shared memory when the peer is on this host, else on the socket."""
        if self.use_shm and msg.total >= self.shm_min_bytes and self.shm.on_host.get(peer, True):
            lengths = await self.shm.send(peer, msg)
            if lengths is not None:
                return lengths
        return await self._send_socket(peer, msg)

    def _take_staging(self, nbytes: int) -> np.ndarray:
        return self._staging.take(nbytes)

    def _give_staging(self, buf: np.ndarray) -> None:
        self._staging.give(buf)

    async def _handle(self, frames: list[memoryview]) -> list[bytes] | None:
        kind = bytes(frames[0]) if frames else b""
        if kind == b"SHMGO" and len(frames) == 5:  # the sender writes into a lent segment: poll it
            self.purge()
            self.shm.go(bytes(frames[1]).decode(errors="replace"), bytes(frames[2]).decode(errors="replace"),
                        frames[3], bytes(frames[4]).decode(errors="replace"))
            return None
        if kind == b"SHMDONE" and len(frames) == 3 and bytes(frames[2]).isdigit():
            self.purge()
            return await self.shm.done(bytes(frames[1]).decode(errors="replace"), int(bytes(frames[2])))
        if kind == b"SHM" and len(frames) == 3:
            self.purge()
            return self.shm.leases.for_message(bytes(frames[1]).decode(), bytes(frames[2]))
        if kind == b"DROP" and len(frames) == 2:
            self.purge()
            self.shm.leases.drop(bytes(frames[1]).decode())
            return [b"OK"]
        return await super()._handle(frames)

    def purge(self) -> None:
        """Drop expired leases (their messages fail, truncated) and half-sent socket messages."""
        for key, error in self.shm.leases.purge():
            self._deliver(key, error)
        super().purge()

    async def close(self) -> None:
        await super().close()
        self.shm.close()
