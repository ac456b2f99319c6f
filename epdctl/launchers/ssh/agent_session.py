"""The node agent, started once per node and connection and reused for every call.

Why: every agent call used to be its own SSH command, so its own shell and Python start on the
node: `up` paid two per node (the version gate, then the start), and on a host with two cores a
few dozen interpreter starts are what made fan-out to many nodes slow. Now the first call runs
the node's setup lines and ``python -S`` once (``-S``: the agent is stdlib only, and a venv's
site is most of an interpreter's start); the program goes in first, sized, then one JSON request
per line, each answered with one ``EPDCTL-AGENT`` line. Requests may carry environment values
(tokens), so they travel on stdin, never on a command line.
"""

from __future__ import annotations

import json
import select
import shlex
import threading
import time
from typing import Any

import paramiko

from epdctl.errors import LaunchError
from epdctl.launchers.ssh.nodes import NodeAccess
from epdctl.node import ssh_agent

_PROGRAM = (ssh_agent.node_source() + "\n_serve()\n").encode()
_BOOT = f"import sys;exec(compile(sys.stdin.buffer.read({len(_PROGRAM)}),'epdctl-agent','exec'))"


class AgentSession:
    """One running agent on one node (a channel of ``conn``); calls are serialised."""

    def __init__(self, pool: Any, acc: NodeAccess):
        self.pool = pool   # the launcher's ConnectionPool: one connection per node
        self.acc = acc
        self._chan: paramiko.Channel | None = None
        self._out = b""
        self._err = b""
        self._lock = threading.Lock()

    def command(self) -> str:
        lines = ["set -e"]
        if self.acc.setup:
            lines += ["{", *self.acc.setup, "} </dev/null"]
        lines.append(f"exec {shlex.quote(self.acc.python)} -S -c {shlex.quote(_BOOT)}")
        return "\n".join(lines)

    def call(self, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one request, wait at most ``timeout`` seconds for its answer."""
        with self._lock:
            if self._chan is None or self._chan.closed:
                self._chan = self.pool.get(self.acc.target).session(self.command())
                self._out, self._err = b"", b""
                fresh = True
            else:
                fresh = False
            chan = self._chan
            try:
                chan.sendall((_PROGRAM if fresh else b"") + json.dumps(req).encode() + b"\n")
            except (OSError, paramiko.SSHException, EOFError) as e:
                if chan.exit_status_ready():   # the setup lines or the shell ended it
                    self._err += chan.recv_stderr(65536) if chan.recv_stderr_ready() else b""
                    self.close()
                    raise self._gone(chan.recv_exit_status()) from None
                self.close()
                raise LaunchError(f"[{self.acc.node}] {req['op']} on the node failed: {e}") from None
            line = self._answer(chan, time.monotonic() + timeout, req["op"], timeout)
        answer: dict[str, Any] = json.loads(line[len(ssh_agent.MARK):])
        if "error" in answer and len(answer) == 1:
            raise LaunchError(f"[{self.acc.node}] {req['op']} failed on the node: {answer['error']}")
        return answer

    def _answer(self, chan: paramiko.Channel, deadline: float, op: str, timeout: float) -> str:
        mark = ssh_agent.MARK.encode()
        while True:
            while b"\n" in self._out:
                raw, self._out = self._out.split(b"\n", 1)
                if raw.startswith(mark):
                    return raw.decode(errors="replace")
            while chan.recv_stderr_ready():
                self._err = (self._err + chan.recv_stderr(65536))[-8192:]
            if chan.recv_ready():
                self._out += chan.recv(65536)
                continue
            if chan.exit_status_ready() or chan.closed:
                rc = chan.recv_exit_status()
                self.close()
                raise self._gone(rc)
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise LaunchError(f"[{self.acc.node}] {op} on the node did not finish within {timeout:.0f}s")
            select.select([chan], [], [], min(left, 1.0))

    def _gone(self, rc: int) -> LaunchError:
        """The agent ended without an answer: which step failed, in words."""
        node, acc = self.acc.node, self.acc
        err = "\n".join(self._err.decode(errors="replace").strip().splitlines()[-10:]) or "(no output)"
        if rc == 127:
            return LaunchError(f"[{node}] {acc.python!r} or a setup command was not found on the "
                               f"node (exit 127): {err}. Fix the topology's python or the node's "
                               f"setup lines")
        what = "its setup lines" if acc.setup else "the node's shell"
        return LaunchError(f"[{node}] {what} failed (exit {rc}) before epdctl could run there: {err}")

    def close(self) -> None:
        if self._chan is not None:
            self._chan.close()
            self._chan = None
