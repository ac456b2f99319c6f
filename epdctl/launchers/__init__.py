"""Launcher registry: a name in a topology or on the command line -> a launcher class.

Adding a backend means one new module and one entry here.
"""

from __future__ import annotations

import importlib
from typing import Any

from epdctl.errors import LaunchError

_LAUNCHERS: dict[str, tuple[str, str]] = {
    "local": ("epdctl.launchers.local", "LocalLauncher"),
    "ssh": ("epdctl.launchers.ssh", "SSHLauncher"),
    "slurm": ("epdctl.slurm.launcher", "SlurmLauncher"),
}


def names() -> list[str]:
    """Launchers this build can run."""
    return sorted(_LAUNCHERS)


def get_launcher(name: str, **kwargs: Any) -> Any:
    """Instantiate the launcher called ``name``; LaunchError listing valid names otherwise."""
    if name not in _LAUNCHERS:
        raise LaunchError(f"unknown launcher {name!r}; available here: {', '.join(names())}")
    module, attr = _LAUNCHERS[name]
    return getattr(importlib.import_module(module), attr)(**kwargs)
