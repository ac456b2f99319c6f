"""How `check` runs the agent on a node: a local process, a process in a network namespace (or
any other argv prefix), or a command over SSH.

Why one small seam: the checks and the link matrix are the same whatever reaches the node; only
"run this argv there" and "start this argv there and read its first line" differ.
"""

from __future__ import annotations

import json
import os
import selectors
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from epdctl.errors import ProbeError


@dataclass(frozen=True)
class Completed:
    rc: int
    stdout: str
    stderr: str


class Spawned(Protocol):
    def readline(self, timeout: float) -> str | None:
        """The next stdout line, or None when none came within ``timeout`` (or it exited)."""
        ...

    def close(self) -> None:
        """Stop the process (it also stops by itself when idle)."""
        ...


class NodeRunner(Protocol):
    node: str
    python: str

    def run(self, argv: Sequence[str], timeout: float) -> Completed: ...

    def spawn(self, argv: Sequence[str]) -> Spawned: ...


class _LocalSpawned:
    def __init__(self, proc: subprocess.Popen[bytes]):
        self.proc = proc
        self._sel = selectors.DefaultSelector()
        assert proc.stdout is not None
        self._sel.register(proc.stdout, selectors.EVENT_READ)

    def readline(self, timeout: float) -> str | None:
        if not self._sel.select(timeout):
            return None
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        return line.decode(errors="replace") if line else None

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(3)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        self._sel.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@dataclass
class LocalRunner:
    """Runs on this machine, optionally behind an argv prefix (``ip netns exec NS``)."""

    node: str
    prefix: tuple[str, ...] = ()
    python: str = field(default_factory=lambda: sys.executable)

    def run(self, argv: Sequence[str], timeout: float) -> Completed:
        try:
            p = subprocess.run([*self.prefix, *argv], capture_output=True, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            return Completed(124, "", f"timed out after {timeout:g}s")
        except OSError as e:
            return Completed(127, "", f"cannot run {argv[0]}: {e.strerror}")
        return Completed(p.returncode, p.stdout, p.stderr)

    def spawn(self, argv: Sequence[str]) -> Spawned:
        try:
            proc = subprocess.Popen([*self.prefix, *argv], stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        except OSError as e:
            raise ProbeError(f"[{self.node}] cannot start {argv[0]}: {e.strerror}") from None
        return _LocalSpawned(proc)


class _SSHSpawned:
    def __init__(self, runner: "SSHRunner", out: Any):
        self.runner, self.out, self.pid = runner, out, None

    def readline(self, timeout: float) -> str | None:
        self.out.channel.settimeout(timeout)
        try:
            line = self.out.readline()
        except OSError:
            return None
        if isinstance(line, bytes):
            line = line.decode(errors="replace")
        if '"pid"' in line:
            try:
                self.pid = json.loads(line).get("pid")
            except ValueError:
                pass
        return line or None

    def close(self) -> None:
        if self.pid:
            self.runner.run(["kill", str(int(self.pid))], timeout=10)
        self.out.channel.close()


@dataclass
class SSHRunner:
    """Runs over an ``epdctl.launchers.ssh.conn.SSHConnection`` (host keys checked there), after the
    node's ``setup`` commands (e.g. activating the environment epdctl is installed in)."""

    node: str
    conn: Any
    python: str = "python3"
    setup: tuple[str, ...] = ()

    def _command(self, argv: Sequence[str]) -> str:
        return " && ".join([*self.setup, "exec " + shlex.join(argv)])

    def run(self, argv: Sequence[str], timeout: float) -> Completed:
        r = self.conn.run(self._command(argv), timeout=timeout)
        return Completed(r.rc, r.stdout, r.stderr)

    def spawn(self, argv: Sequence[str]) -> Spawned:
        return _SSHSpawned(self, self.conn.stream(self._command(argv)))
