"""Where SSH fan-out time goes: the handshake, one command's session, the agent's start, a call
to a running agent; one node against N nodes in parallel (real sshd daemons, tests/sshd_nodes.py).

Per case, with fresh connections: ``connect`` (TCP, key exchange, host-key check, login),
``exec-true`` (one SSH command, ``true``: sshd's session and the login user's shell, whose
startup file runs for every command), ``agent-start+call`` (the node agent started through the
setup lines and ``python -S``, one request), ``warm-call`` (one more request to the running
agent). Measured, not asserted; each case twice.

    flock /tmp/epd-heavy.lock .venv/bin/python benchmarks/bench_ssh_phases.py [--nodes 24]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from sshd_nodes import SshdNodes  # noqa: E402

from epdctl.launchers.ssh.agent_session import AgentSession  # noqa: E402
from epdctl.launchers.ssh.conn import ConnectionPool, SSHOptions, SSHTarget  # noqa: E402
from epdctl.launchers.ssh.fanout import fanout  # noqa: E402
from epdctl.launchers.ssh.nodes import NodeAccess  # noqa: E402

PORT = 31790


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=24)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="epd-bench-ssh-phases-"))
    tail = {"op": "tail", "log": "/nonexistent", "lines": 1}
    with SshdNodes(tmp / "sshd", args.nodes, port=PORT) as sshd:
        opts = SSHOptions(known_hosts=(str(sshd.known_hosts),), ssh_config=None)
        nodes = {n.name: NodeAccess(n.name, SSHTarget(n.name, n.host, sshd.user, n.port, str(sshd.client_key)),
                                    ("export EPD_BENCH=1",), sys.executable) for n in sshd.nodes}
        names = list(nodes)
        print(f"{'nodes':>5} {'connect':>9} {'exec-true':>10} {'agent-start+call':>17} {'warm-call':>10}  (seconds)")
        for subset in (names[:1], names, names[:1], names):
            pool = ConnectionPool(opts)
            sess = {n: AgentSession(pool, nodes[n]) for n in subset}
            each = {n: n for n in subset}
            t0 = time.perf_counter()
            fanout(each, lambda n, _: pool.get(nodes[n].target))
            t1 = time.perf_counter()
            fanout(each, lambda n, _: pool.get(nodes[n].target).run("true"))
            t2 = time.perf_counter()
            fanout(each, lambda n, _: sess[n].call(tail, 60))
            t3 = time.perf_counter()
            fanout(each, lambda n, _: sess[n].call(tail, 60))
            t4 = time.perf_counter()
            for s in sess.values():
                s.close()
            pool.close()
            print(f"{len(subset):>5} {t1 - t0:>9.2f} {t2 - t1:>10.2f} {t3 - t2:>17.2f} {t4 - t3:>10.2f}", flush=True)


if __name__ == "__main__":
    main()
