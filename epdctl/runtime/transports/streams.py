"""The receiver's book of socket messages that arrive as several ZMQ messages (zmq.py's BLOBPART).

A large message goes on the socket as parts of ~``PART_BYTES``, each its own ZMQ message, so
the sender copies and hashes part k+1 while part k is on the wire and the receiver checks it:
the stages overlap, and a part is still in cache when the next stage reads it. The first part
carries the message's header and opens its ``Incoming``; later parts name only its key; the
last (BLOB) is answered. A message whose sender stopped half-way is dropped after the timeout;
a part without its first one is remembered as the message's error, which the answer reports.
"""

from __future__ import annotations

import time

from ..errors import TransferError
from ..wire import Frame, parse_header
from .parts import Incoming


class Streams:
    def __init__(self, timeout: float):
        self.timeout = timeout
        self.open: dict[str, Incoming] = {}

    def take(self, key: str, header: Frame) -> Incoming:
        """The message ``key`` a part belongs to: opened by its header (the first part), else the one
        under way (taken out of the book: ``keep`` puts it back until its last part)."""
        if memoryview(header).nbytes:
            self.open.pop(key, None)  # a stale attempt of the same key is replaced
            try:
                return Incoming.open(key, parse_header(header))
            except (TransferError, KeyError, TypeError, ValueError) as exc:
                return _failed(key, exc if isinstance(exc, TransferError) else TransferError(f"bad message header: {exc}"))
        incoming = self.open.pop(key, None)
        if incoming is None:
            return _failed(key, TransferError(f"transfer of {key!r} truncated: a part arrived without its first "
                                              "part (lost, or expired after the timeout)"))
        return incoming

    def keep(self, incoming: Incoming) -> None:
        self.open[incoming.key] = incoming

    def purge(self) -> None:
        if not self.open:
            return
        now = time.monotonic()
        for key in [k for k, inc in self.open.items() if now - inc.started > self.timeout]:
            del self.open[key]


def _failed(key: str, error: TransferError) -> Incoming:
    incoming = Incoming(key, {"tensors": [], "meta": {}}, [], 0)
    incoming.error = error
    return incoming
