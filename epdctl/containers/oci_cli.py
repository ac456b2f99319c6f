"""docker and podman: ``PROGRAM [OPTIONS] run --rm --name NAME --label ... IMAGE COMMAND``.

Both read the same ``run`` options (docs.docker.com/reference/cli/docker/container/run/,
docs.podman.io podman-run(1)); they differ in how GPUs are asked for: docker's ``--gpus``
(the NVIDIA container toolkit) and podman's CDI devices ``nvidia.com/gpu=N``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from epdctl.containers.base import LABEL_CLUSTER, LABEL_NODE, ContainerRuntime, Run, mount_text, ulimit_value
from epdctl.containers.spec import Container

# distribution/reference (the grammar docker and podman parse): [domain[:port]/]path[:tag][@digest]
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*(?::[0-9]+)?"
REFERENCE = re.compile(rf"^(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?"
                       r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$")


def reference_problem(image: str) -> str | None:
    if REFERENCE.match(image) and len(image) <= 255:
        return None
    why = "upper-case letters are not allowed in the repository name" if re.search(r"[A-Z]", image.split(":")[0]
                                                                                  .rsplit("/", 1)[-1]) else \
        "it is not [REGISTRY[:PORT]/]NAME[:TAG][@sha256:DIGEST]"
    return f"{image!r} is not an image reference: {why} (e.g. lmsysorg/sglang:v0.5.3-cu126)"


@dataclass(frozen=True)
class OciCli(ContainerRuntime):
    gpu_flag: str = "--gpus"  # docker: --gpus '"device=0,1"'; podman: --device nvidia.com/gpu=0
    remove_options: tuple[str, ...] = ("--force",)

    def image_problem(self, image: str) -> str | None:
        return reference_problem(image)

    def _gpus(self, c: Container, run: Run) -> list[str]:
        if c.gpus == "none" or (c.gpus == "auto" and not run.gpus):
            return []
        if self.gpu_flag == "--gpus":
            return ["--gpus", "all" if c.gpus == "all" else f'"device={",".join(map(str, run.gpus))}"']
        ids = ["all"] if c.gpus == "all" else [str(g) for g in run.gpus]
        return [a for g in ids for a in ("--device", f"nvidia.com/gpu={g}")]

    def command(self, c: Container, run: Run, inner: tuple[str, ...]) -> tuple[str, ...]:
        argv = [self.program, *c.options, "run", "--rm", "--init", "--name", run.name]
        argv += [a for k, v in {LABEL_CLUSTER: run.cluster, **run.labels}.items() for a in ("--label", f"{k}={v}")]
        argv += [f"--network={c.network}", f"--ipc={c.ipc}"]
        if c.privileged:
            argv.append("--privileged")
        argv += self._gpus(c, run)
        argv += [a for d in c.devices or () for a in ("--device", d)]
        argv += [a for cap in c.cap_add for a in ("--cap-add", cap)]
        if c.shm_size:
            argv += ["--shm-size", c.shm_size]
        argv += [a for k, v in c.ulimits.items() for a in ("--ulimit", f"{k}={ulimit_value(v)}")]
        argv += [a for m in c.mounts for a in ("--volume", mount_text(m.source, m.target, m.readonly))]
        argv += [a for k, v in c.env.items() for a in ("--env", f"{k}={v}")]
        argv += [a for k in run.env_names for a in ("--env", k)]  # the value comes from the launching environment
        if c.workdir:
            argv += ["--workdir", c.workdir]
        return (*argv, *c.args, c.image, *inner)

    def remove(self, c: Container, names: tuple[str, ...]) -> tuple[str, ...] | None:
        return (self.program, *c.options, "rm", *self.remove_options, *names) if names else None

    def find(self, c: Container, cluster: str, node: str | None = None) -> tuple[str, ...] | None:
        where = [f"label={LABEL_CLUSTER}={cluster}", *([f"label={LABEL_NODE}={node}"] if node else [])]
        return (self.program, *c.options, "ps", "--all", *[a for w in where for a in ("--filter", w)],
                "--format", "{{.Names}}")

    def pull(self, c: Container) -> tuple[str, ...] | None:
        return (self.program, *c.options, "pull", c.image)

    def image_digest(self, c: Container) -> tuple[str, ...] | None:
        return (self.program, *c.options, "image", "inspect", "--format", "{{.Id}}", c.image)


DOCKER = OciCli("docker", "docker", image_forms="[REGISTRY/]NAME[:TAG][@DIGEST]")
PODMAN = OciCli("podman", "podman", image_forms="[REGISTRY/]NAME[:TAG][@DIGEST]", gpu_flag="--device",
                remove_options=("--force", "--ignore"))
