"""A container runtime as a record: how it wraps one process's command, where its image comes
from, and how `down` finds and removes what it started. One module per form
(oci_cli: docker and podman; apptainer; pyxis; slurm_oci); the registry looks them up by name."""

from __future__ import annotations

from dataclasses import dataclass, field

from epdctl.containers.spec import Container

LABEL_CLUSTER, LABEL_NODE, LABEL_PROCESS = "epdctl.cluster", "epdctl.node", "epdctl.process"


@dataclass(frozen=True)
class Run:
    """What the wrapper knows about the one process it wraps."""

    name: str  # the container's name: epdctl-<cluster>-<process>
    cluster: str
    process: str
    env_names: tuple[str, ...]  # variables handed in from the launching environment, by name
    gpus: tuple[int, ...] = ()  # the worker's GPUs on its node (empty: none or not a GPU engine)
    rdma: bool = False  # the worker's node declares ib/roce NICs the worker uses
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ContainerRuntime:
    """One way to run a process in a container. ``step``: the runtime is a SLURM job step's own
    options (pyxis, SLURM's OCI support), so the process runs as ``srun OPTIONS COMMAND``."""

    name: str
    program: str
    step: bool = False
    image_forms: str = ""  # for messages: what an image reference looks like here

    def image_problem(self, image: str) -> str | None:
        """Why ``image`` is no image this runtime can start (None: it is)."""
        return None

    def missing(self, c: Container) -> str | None:
        """What ``c`` needs that is not there, where this machine can tell (a SLURM OCI bundle on
        the shared filesystem and the mounts its config.json holds); None: all there, or only the
        nodes can tell (a registry image, a file on the nodes)."""
        return None

    def command(self, c: Container, run: Run, inner: tuple[str, ...]) -> tuple[str, ...]:
        """The full command line: ``inner`` (the engine's argv) inside the container."""
        raise NotImplementedError

    def step_options(self, c: Container, run: Run) -> tuple[str, ...]:
        """srun options that put a step into the container (step runtimes only)."""
        return ()

    def remove(self, c: Container, names: tuple[str, ...]) -> tuple[str, ...] | None:
        """A command removing the named containers, running or not (None: nothing outlives the
        process: apptainer, SLURM steps)."""
        return None

    def find(self, c: Container, cluster: str, node: str | None = None) -> tuple[str, ...] | None:
        """A command printing the names of the containers labelled with ``cluster`` (and
        ``node`` when given), running or not, one a line (None: nothing outlives the process)."""
        return None

    def image_digest(self, c: Container) -> tuple[str, ...] | None:
        """A command printing the image's id or digest (None: the runtime has none to ask)."""
        return None

    def version(self, c: Container) -> tuple[str, ...]:
        """A command that succeeds where the runtime is installed (preflight)."""
        return (self.program, "--version")

    def pull(self, c: Container) -> tuple[str, ...] | None:
        """How an operator fetches a missing image (for messages; None: the image is a file)."""
        return None


def ulimit_value(value: str) -> str:
    """``-1`` / ``unlimited`` (soft and hard), or ``soft[:hard]`` as docker's ``--ulimit`` reads it."""
    parts = [p.strip() for p in str(value).split(":")]
    parts = ["-1" if p in ("-1", "unlimited") else p for p in parts]
    return ":".join(parts if len(parts) == 2 else parts * 2)


def mount_text(source: str, target: str, readonly: bool, ro: str = "ro") -> str:
    return f"{source}:{target}" + (f":{ro}" if readonly else "")


def short_id(image_id: str) -> str:
    """``sha256:`` and the first 12 hex digits of an image id, as the runtimes' image lists show it."""
    return "sha256:" + image_id.split(":", 1)[-1][:12]
