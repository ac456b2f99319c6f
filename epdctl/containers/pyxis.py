"""pyxis (enroot through SLURM's SPANK): the worker is a job step with pyxis's srun options,
``srun --container-image=IMAGE --container-mounts=SRC:DST[:FLAGS],... --no-container-entrypoint
--no-container-mount-home --container-name=NAME COMMAND`` (the flags pyxis registers in its
args.c ``spank_opts``; tests/fixtures/containers/pyxis_spank_opts.c). enroot shares the host's
network and IPC; the IB devices arrive through enroot's mellanox hook when
``MELLANOX_VISIBLE_DEVICES`` is set, GPUs through its nvidia hook (``NVIDIA_VISIBLE_DEVICES``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from epdctl.containers.base import ContainerRuntime, Run
from epdctl.containers.spec import Container

# enroot URI without the docker:// scheme: [USER@][REGISTRY#]IMAGE[:TAG]
ENROOT_URI = re.compile(r"^(?:[^@#/\s]+@)?(?:[A-Za-z0-9.-]+(?::[0-9]+)?#)?[a-z0-9]+(?:[._/-]+[a-z0-9]+)*"
                        r"(?::[\w][\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$")
SQUASHFS = (".sqsh", ".squashfs", ".sqfs")


@dataclass(frozen=True)
class Pyxis(ContainerRuntime):
    def image_problem(self, image: str) -> str | None:
        if image.startswith(("/", "./")):
            return None
        if image.endswith(SQUASHFS):  # pyxis #127: anything else is read as a registry image
            fix = f"./{image}" if not image.startswith("../") else "its absolute path"
            return (f"pyxis reads {image!r} as a registry image, not a file: a squashfs path must start with / or "
                    f"./; write {fix}")
        head, sep, rest = image.partition("/")
        if "#" not in image and sep and ("." in head or ":" in head) and "@" not in head:
            return (f"enroot separates the registry from the image with '#', not '/': write {head}#{rest} "
                    f"(pyxis --container-image takes [USER@][REGISTRY#]IMAGE[:TAG])")
        if not ENROOT_URI.match(image):
            return f"{image!r} is not an enroot image URI [USER@][REGISTRY#]IMAGE[:TAG] nor a squashfs path (/x.sqsh)"
        return None

    def step_options(self, c: Container, run: Run) -> tuple[str, ...]:
        out = [f"--container-image={c.image}"]
        if c.mounts:
            out.append("--container-mounts=" + ",".join(
                f"{m.source}:{m.target}" + (":ro" if m.readonly else "") for m in c.mounts))
        if c.workdir:
            out.append(f"--container-workdir={c.workdir}")
        out += ["--no-container-entrypoint", "--no-container-mount-home", f"--container-name={run.name}"]
        names = [*c.env, *run.env_names]
        if names:  # the host's values win over the image's for these
            out.append("--container-env=" + ",".join(dict.fromkeys(names)))
        return (*out, *c.args)

    def command(self, c: Container, run: Run, inner: tuple[str, ...]) -> tuple[str, ...]:
        return ("srun", *self.step_options(c, run), *inner)


PYXIS = Pyxis("pyxis", "srun", step=True, image_forms="[USER@][REGISTRY#]IMAGE[:TAG] or /path/image.sqsh")
