"""A program run to completion on a node, fed a request on stdin, read line by line as it runs
(staging weights: the node copies and says how far it got).

Each launcher says how it reaches a node for that (``Launcher.node_jobs``): a local process,
a process behind an argv prefix (``srun --jobid J --overlap --nodelist N``: a step inside the
SLURM allocation), or a command over SSH (``launchers/ssh/streams.py``).
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from typing import IO, Iterator, Protocol, Sequence

from epdctl.errors import LaunchError


class LineStream(Protocol):
    def lines(self) -> Iterator[str]:
        """stdout, one line at a time, until the program closes it."""
        ...

    def finish(self) -> tuple[int, str]:
        """Wait for the exit: (status, the end of stderr)."""
        ...


class NodeJobs(Protocol):
    node: str
    python: str

    def start(self, argv: Sequence[str], stdin: bytes) -> LineStream: ...


class _Process:
    def __init__(self, proc: subprocess.Popen[bytes], stdin: bytes):
        self.proc = proc
        assert proc.stdin is not None
        try:
            proc.stdin.write(stdin)
            proc.stdin.close()
        except BrokenPipeError:
            pass

    def lines(self) -> Iterator[str]:
        out: IO[bytes] | None = self.proc.stdout
        assert out is not None
        for line in out:
            yield line.decode(errors="replace")

    def finish(self) -> tuple[int, str]:
        rc = self.proc.wait()
        err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()
        return rc, err[-2000:]


@dataclass
class ProcessJobs:
    """Programs run on this machine, behind ``prefix`` (empty, or an ``srun`` step), after the
    node's ``setup`` lines when it has any."""

    node: str
    python: str
    prefix: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()

    def start(self, argv: Sequence[str], stdin: bytes) -> LineStream:
        cmd = list(argv)
        if self.setup:
            cmd = ["bash", "-c", " && ".join([*self.setup, "exec " + shlex.join(argv)])]
        try:
            proc = subprocess.Popen([*self.prefix, *cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
        except OSError as e:
            raise LaunchError(f"[{self.node}] cannot run {self.prefix[:1] or cmd[:1]}: {e.strerror}") from None
        return _Process(proc, stdin)
