"""What a topology's ``container:`` block says, after layering (epdctl/topology/container.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Mount:
    """A bind mount into a worker's container; ``target`` defaults to the same path."""

    source: str
    target: str
    readonly: bool = False


@dataclass(frozen=True)
class Container:
    """How a worker's process runs in a container (``container:``, layered like other settings).
    The runtime's record (epdctl/containers/) turns it into the command around the engine's."""

    image: str
    runtime: str = "podman"  # docker | podman | apptainer | pyxis | slurm-oci
    mounts: tuple[Mount, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    devices: tuple[str, ...] | None = None  # host devices passed in (None: /dev/infiniband when RDMA)
    gpus: str = "auto"  # auto: the worker's GPUs when its engine uses GPUs | all | none
    shm_size: str | None = None
    ulimits: dict[str, str] = field(default_factory=dict)  # name -> "soft[:hard]" (-1: unlimited)
    network: str = "host"
    ipc: str = "host"
    privileged: bool = False
    cap_add: tuple[str, ...] = ()
    options: tuple[str, ...] = ()  # the runtime program's own options, before its run command
    args: tuple[str, ...] = ()  # extra options of the run command
    workdir: str | None = None
    path: str = ""  # the YAML path of the most specific container: block, for messages


__all__ = ["Container", "Mount"]
