"""Listening sockets bound before anything is served, and the supervisor's ready byte.

A worker binds every port it serves first (a busy port is a start failure: the supervisor does
not restart it, `up` reports it), then writes one byte to ``EPDCTL_READY_FD`` (the pipe its
supervisor, epdctl/launchers/supervise.py, passes), and only then starts answering, ``/health``
included. So a worker that anyone has seen healthy is already armed for restarts, however soon
it dies: there is no window between "healthy" and "the supervisor knows".
"""

from __future__ import annotations

import logging
import os
import socket

from epdctl.runtime.errors import RuntimeWorkerError

log = logging.getLogger(__name__)

READY_FD_ENV = "EPDCTL_READY_FD"  # the contract with launchers/supervise.py (not imported: layering)
BACKLOG = 1024


def bind(host: str, port: int) -> socket.socket:
    """A listening, non-blocking TCP socket on host:port; RuntimeWorkerError if it cannot be had."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise RuntimeWorkerError(f"cannot listen on {host}:{port}: {exc.strerror or exc} "
                                 "(not an address of this machine?)") from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise RuntimeWorkerError(f"cannot listen on {host}:{port}: {exc.strerror or exc} "
                                 "(is another process using this port?)") from None
    return sock


def notify_ready() -> bool:
    """Write the ready byte to the supervisor's pipe (once); False when not supervised."""
    raw = os.environ.pop(READY_FD_ENV, "")
    if not raw.isdigit():
        return False
    fd = int(raw)
    try:
        os.write(fd, b"R")
        return True
    except OSError as exc:  # not ours, or the supervisor is gone: nothing to tell
        log.debug("cannot write the ready byte to fd %d: %s", fd, exc)
        return False
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
