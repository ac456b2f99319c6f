"""Container runtimes by name."""

from __future__ import annotations

from epdctl.containers.apptainer import APPTAINER
from epdctl.containers.base import ContainerRuntime
from epdctl.containers.oci_cli import DOCKER, PODMAN
from epdctl.containers.pyxis import PYXIS
from epdctl.containers.slurm_oci import SLURM_OCI

RUNTIMES: tuple[ContainerRuntime, ...] = (DOCKER, PODMAN, APPTAINER, PYXIS, SLURM_OCI)
RUNTIME_NAMES: tuple[str, ...] = tuple(r.name for r in RUNTIMES)


def runtime_for(name: str) -> ContainerRuntime:
    for r in RUNTIMES:
        if r.name == name:
            return r
    raise KeyError(name)
