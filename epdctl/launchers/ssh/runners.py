"""How `check` and `up`'s preflight reach ssh nodes: the launcher's own connections.

Why the launcher's pool and not a fresh one: the preflight must reach a node exactly as the
launcher will (the same jump hosts, setup lines, known_hosts files and host-key policy,
--accept-new-host-keys included), and `up` then starts workers over the connections the
preflight already opened (and whose new host keys it already recorded).
"""

from __future__ import annotations

from typing import Any, Mapping

from epdctl.launchers.ssh.nodes import NodeAccess
from epdctl.preflight.runners import SSHRunner


class LazyConn:
    """Connects on first use, inside the fan-out thread, so one dead node never blocks others."""

    def __init__(self, pool: Any, target: Any):
        self.pool, self.target = pool, target

    def run(self, command: str, timeout: float | None = None) -> Any:
        return self.pool.get(self.target).run(command, timeout=timeout)

    def stream(self, command: str) -> Any:
        return self.pool.get(self.target).stream(command)


def ssh_runners(pool: Any, access: Mapping[str, NodeAccess]) -> dict[str, SSHRunner]:
    """One runner per node, over ``pool`` (an ``ssh.conn.ConnectionPool``)."""
    return {n: SSHRunner(n, LazyConn(pool, a.target), python=a.python, setup=tuple(a.setup))
            for n, a in access.items()}
