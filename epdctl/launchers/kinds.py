"""What the rest of epdctl needs to know about a launcher before building one: records read
instead of branching on a launcher's name (the launchers themselves are in the registry)."""

from __future__ import annotations

from dataclasses import dataclass

from epdctl.errors import LaunchError


@dataclass(frozen=True)
class LauncherKind:
    name: str
    allocates_nodes: bool = False  # a scheduler picks the machines: nodes are slots of an allocation
    ssh: bool = False  # reaches nodes over SSH (a node's ssh: settings apply)
    batch_script: bool = False  # `epdctl render --launcher NAME` prints a script to submit
    job_steps: bool = False  # every process is a job step (srun): container runtimes that are step options fit


KINDS: tuple[LauncherKind, ...] = (
    LauncherKind("local"),
    LauncherKind("ssh", ssh=True),
    LauncherKind("slurm", allocates_nodes=True, batch_script=True, job_steps=True),
)
LAUNCHER_NAMES: tuple[str, ...] = tuple(k.name for k in KINDS)


def launcher_kind(name: str) -> LauncherKind:
    for k in KINDS:
        if k.name == name:
            return k
    raise LaunchError(f"unknown launcher {name!r}; known launchers: {', '.join(LAUNCHER_NAMES)}")


def allocates_nodes(name: str | None) -> bool:
    """Does launcher ``name`` (None: not given or not valid) place workers on allocated nodes?"""
    return name is not None and name in LAUNCHER_NAMES and launcher_kind(name).allocates_nodes


def batch_kind(name: str) -> LauncherKind | None:
    """The launcher ``name`` when it has a batch script to render, else None."""
    kind = launcher_kind(name) if name in LAUNCHER_NAMES else None
    return kind if kind is not None and kind.batch_script else None
