"""A doorbell: a unix datagram socket (abstract namespace) read by this process's event loop.

A ZMQ message between two idle processes on one host wakes three threads (the sender's I/O
thread, the receiver's I/O thread, then its event loop), which on a shared host was most of a
large shared-memory hand-off. A datagram written by the sender's own thread wakes
the receiver's event loop directly (one wake-up). The same-host path rings it to announce a
message (GO), to say every part is written (DONE) and to say the answer is in the segment (ACK);
the data and the answer themselves stay in the segment. A doorbell that cannot be reached (another
network namespace over a shared /dev/shm) makes ``ring`` return False and the caller use the
ZMQ socket instead. Anyone on the host may ring: a ring only names a lease, which must be open.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from typing import Callable

log = logging.getLogger(__name__)
MAX_DATAGRAM = 60 << 10  # larger announcements go on the ZMQ socket


class Doorbell:
    def __init__(self, on_ring: Callable[[bytes], None]):
        self.on_ring = on_ring
        self.address = ""
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def open(self) -> bool:
        """Bind and start reading (inside the running loop); False when the host has no unix sockets."""
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            name = f"epd-bell-{uuid.uuid4().hex[:16]}"
            sock.bind("\0" + name)
            sock.setblocking(False)
        except OSError as exc:
            log.debug("doorbell unavailable: %s", exc)
            return False
        self._sock, self.address = sock, "@" + name
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._read)
        return True

    def _read(self) -> None:
        assert self._sock is not None
        while True:
            try:
                data = self._sock.recv(MAX_DATAGRAM + 1024)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            try:
                self.on_ring(data)
            except Exception:  # a malformed ring never stops the doorbell
                log.exception("doorbell: ring failed")

    def ring(self, address: str, data: bytes) -> bool:
        """Send ``data`` to the doorbell at ``address`` ('@name'); False if it cannot be reached."""
        if self._sock is None or not address.startswith("@") or len(data) > MAX_DATAGRAM:
            return False
        try:
            self._sock.sendto(data, "\0" + address[1:])
            return True
        except OSError:
            return False

    def close(self) -> None:
        if self._sock is not None:
            if self._loop is not None and not self._loop.is_closed():
                try:
                    self._loop.remove_reader(self._sock.fileno())
                except (ValueError, RuntimeError):
                    pass
            self._sock.close()
            self._sock = None
