"""Launcher registry: a name in a topology or on the command line -> a launcher class.

Adding a backend means one new module and one entry here.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epdctl.errors import LaunchError

if TYPE_CHECKING:
    from epdctl.launchers.base import Launcher

_LAUNCHERS: dict[str, tuple[str, str]] = {
    "local": ("epdctl.launchers.local", "LocalLauncher"),
    "ssh": ("epdctl.launchers.ssh", "SSHLauncher"),
    "slurm": ("epdctl.launchers.slurm.launcher", "SlurmLauncher"),
}


def names() -> list[str]:
    """Launchers this build can run."""
    return sorted(_LAUNCHERS)


def get_launcher(name: str, cluster_dir: Path | None = None, topology: Any = None,
                 accept_new_host_keys: bool = False) -> "Launcher":
    """The launcher called ``name``, built the one way every launcher is built (see
    ``launchers/base.py``); LaunchError listing valid names otherwise."""
    if name not in _LAUNCHERS:
        raise LaunchError(f"unknown launcher {name!r}; available here: {', '.join(names())}")
    module, attr = _LAUNCHERS[name]
    cls = getattr(importlib.import_module(module), attr)
    launcher: Launcher = cls(cluster_dir, topology, accept_new_host_keys)
    return launcher
