"""What every launcher offers: start a process from a spec, tell if it lives, stop it.

A launcher returns values and raises ``LaunchError``; it never prints. Operations over many
workers return a ``Results`` map so that one failing worker never hides the others.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Iterable, Mapping, Protocol, TypeVar

from epdctl.errors import LaunchError

T = TypeVar("T")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class LaunchSpec:
    """One process to start: a worker or the router, as the plan rendered it."""

    name: str
    role: str
    node: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, spec: Any, role: str | None = None) -> "LaunchSpec":
        """Adapt a plan ``WorkerSpec`` or ``RouterSpec`` (read by attribute)."""
        return cls(
            name=getattr(spec, "name", None) or "router",
            role=role or spec.role,
            node=spec.node,
            argv=tuple(spec.argv),
            env=dict(spec.env or {}),
        )


@dataclass(frozen=True)
class Handle:
    """A started process: enough to find, signal and read it again from another shell."""

    name: str
    role: str
    node: str
    pid: int
    pgid: int
    create_time: float
    log: Path
    since: float
    argv: tuple[str, ...]


@dataclass
class Results(Generic[T]):
    """Per-worker outcome of an operation over many workers."""

    ok: dict[str, T] = field(default_factory=dict)
    failed: dict[str, Exception] = field(default_factory=dict)

    @property
    def all_ok(self) -> bool:
        return not self.failed

    def raise_if_failed(self, what: str) -> None:
        """One LaunchError listing every failed worker as ``[name] reason``."""
        if self.failed:
            lines = "\n".join(f"  [{n}] {e}" for n, e in self.failed.items())
            raise LaunchError(f"{what} failed for {len(self.failed)} worker(s):\n{lines}")


class Launcher(Protocol):
    """The seam between the commands and a way to run processes (local, ssh, slurm)."""

    name: str

    def start(self, spec: LaunchSpec, log: Path) -> Handle:
        """Start ``spec`` detached in its own process group, output appended to ``log``."""
        ...

    def is_alive(self, handle: Handle) -> bool:
        """True while any process of the handle's group is still running."""
        ...

    def stop(self, handles: Iterable[Handle], grace: float = 10.0) -> Results[None]:
        """SIGTERM every group, then SIGKILL what is left after ``grace`` seconds."""
        ...


def expand_env(env: Mapping[str, str], where: str, source: Mapping[str, str] | None = None
               ) -> dict[str, str]:
    """Resolve ``${VAR}`` references from the caller's environment at launch time.

    Plans never hold secret values; they are filled in here and never written anywhere.
    """
    source = os.environ if source is None else source
    out: dict[str, str] = {}
    for key, value in env.items():
        def sub(m: re.Match[str]) -> str:
            var = m.group(1)
            if var not in source:
                raise LaunchError(
                    f"[{where}] environment variable {var} (used by {key}) is not set; "
                    f"export it before running epdctl"
                )
            return source[var]
        out[key] = _VAR.sub(sub, str(value))
    return out


def expand_argv(argv: list[str], where: str) -> list[str]:
    """Expand ``${VAR}`` references inside command-line items (same rules as env)."""
    named = {f"argument {i}": a for i, a in enumerate(argv)}
    return list(expand_env(named, where).values())


def tail(path: Path, n: int = 20) -> str:
    """The last ``n`` lines of a log file ('' when it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read()
    except FileNotFoundError:
        return ""
    lines = data.decode(errors="replace").splitlines()
    return "\n".join(lines[-n:]) if n > 0 else ""
