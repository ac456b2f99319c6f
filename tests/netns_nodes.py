"""Network namespaces as cluster nodes: each with its own eth0 and IP behind one bridge.

Layout (docs: /work/shared/reference/test-infra.md, section 2): bridge ``<p>-br0`` holding
10.77.0.254/24 in the root namespace; per node a veth ``<p>-h<i>`` (root side, on the bridge)
<-> ``eth0`` in namespace ``<p>-n<i>`` with 10.77.0.<i>/24. Before any address exists the root
namespace gets ``unreachable 10.77.0.0/16``, so a test address can never leave through the
default route; the bridge's /24 is more specific and keeps working. Teardown deletes the
root-side veths first (``ip netns del`` frees them asynchronously), then namespaces, bridge and
the guard route (only if this fixture added it).

Also: ``throttle(i)`` (tc tbf, the only shaping qdisc this kernel has), ``link_down(i)``, and a
``runner(i)`` that runs argv inside node i with ``ip netns exec``.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field

from epdctl.preflight.runners import LocalRunner

GUARD = "10.77.0.0/16"


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(argv, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed (exit {p.returncode}): {p.stderr.strip()}")
    return p


@dataclass
class NetnsNodes:
    count: int
    prefix: str = "h6"
    subnet: str = "10.77.0"
    _guard_added: bool = field(default=False, init=False)

    def ns(self, i: int) -> str:
        return f"{self.prefix}-n{i}"

    def ip(self, i: int) -> str:
        return f"{self.subnet}.{i}"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br0"

    def up(self) -> "NetnsNodes":
        self.down()  # leftovers of an interrupted run
        routes = sh("ip", "route", "show", GUARD).stdout
        if "unreachable" not in routes:
            sh("ip", "route", "add", "unreachable", GUARD)
            self._guard_added = True
        taken = sh("ip", "route", "show", f"{self.subnet}.0/24").stdout.strip()
        if taken:
            raise RuntimeError(f"{self.subnet}.0/24 is already routed ({taken}); another test's "
                               f"namespaces are up; rerun when they are gone")
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for i in range(1, self.count + 1):
            ns, host = self.ns(i), f"{self.prefix}-h{i}"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", host, "master", self.bridge)
            sh("ip", "link", "set", host, "up")
            sh("ip", "-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        return self

    def throttle(self, i: int, rate: str = "100mbit") -> None:
        """Shape node i's egress (a slow NIC): tbf as measured in test-infra.md."""
        sh("ip", "netns", "exec", self.ns(i), "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
           "rate", rate, "burst", "64kb", "latency", "50ms")

    def link_down(self, i: int) -> None:
        sh("ip", "-n", self.ns(i), "link", "set", "eth0", "down")

    def runner(self, i: int, node: str | None = None) -> LocalRunner:
        return LocalRunner(node or f"n{i}", prefix=("ip", "netns", "exec", self.ns(i)))

    def down(self) -> None:
        for i in range(1, self.count + 1):
            sh("ip", "link", "del", f"{self.prefix}-h{i}", check=False)
            sh("ip", "netns", "del", self.ns(i), check=False)
        sh("ip", "link", "del", self.bridge, check=False)
        if self._guard_added:
            sh("ip", "route", "del", "unreachable", GUARD, check=False)
            self._guard_added = False

    def __enter__(self) -> "NetnsNodes":
        try:
            return self.up()
        except BaseException:
            self.down()
            raise

    def __exit__(self, *exc: object) -> None:
        self.down()
