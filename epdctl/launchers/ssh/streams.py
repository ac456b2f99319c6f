"""Programs run to completion on ssh nodes, stdin in and stdout lines out (``streams.NodeJobs``),
over the launcher's own connections (its host-key policy and jump hosts included)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import paramiko

from epdctl.launchers.ssh.config import SSHError
from epdctl.launchers.ssh.nodes import NodeAccess
from epdctl.launchers.streams import LineStream


class _Channel:
    def __init__(self, node: str, chan: paramiko.Channel, stdin: bytes):
        self.node, self.chan = node, chan
        try:
            chan.sendall(stdin)
            chan.shutdown_write()
        except (OSError, paramiko.SSHException) as e:
            raise SSHError(f"[{node}] sending the request failed: {e}") from None

    def lines(self) -> Iterator[str]:
        with self.chan.makefile("rb") as out:
            for line in out:
                yield line.decode(errors="replace") if isinstance(line, bytes) else line

    def finish(self) -> tuple[int, str]:
        rc = self.chan.recv_exit_status()
        err = b""
        while self.chan.recv_stderr_ready():
            err += self.chan.recv_stderr(65536)
        self.chan.close()
        return rc, err.decode(errors="replace")[-2000:]


@dataclass
class SSHJobs:
    """``start`` runs argv on the node after its setup lines, as the workers will be run."""

    node: str
    pool: Any  # ssh.conn.ConnectionPool
    access: NodeAccess

    @property
    def python(self) -> str:
        return self.access.python

    def start(self, argv: Sequence[str], stdin: bytes) -> LineStream:
        command = " && ".join([*self.access.setup, "exec " + shlex.join(argv)])
        return _Channel(self.node, self.pool.get(self.access.target).session(command), stdin)
