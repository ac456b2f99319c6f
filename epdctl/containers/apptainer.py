"""apptainer (and singularity): ``apptainer exec --nv --bind SRC:DST[:ro] --env K=V IMAGE COMMAND``.

Flags as apptainer's ``exec`` documents them (apptainer.org/docs/user/main/cli/apptainer_exec.html):
``--nv`` sets up the NVIDIA GPU libraries and devices, ``--bind`` mounts (``src[:dest[:opts]]``),
``--env`` sets variables; the host network, IPC and process space are shared by default, and the
host environment is passed in unless ``--cleanenv``. Nothing outlives the process."""

from __future__ import annotations

import re
from dataclasses import dataclass

from epdctl.containers.base import ContainerRuntime, Run, mount_text
from epdctl.containers.oci_cli import reference_problem
from epdctl.containers.spec import Container

URI = re.compile(r"^(docker|docker-daemon|docker-archive|oci|oci-archive|oras|library|shub|http|https)://(.+)$")


@dataclass(frozen=True)
class Apptainer(ContainerRuntime):
    def image_problem(self, image: str) -> str | None:
        m = URI.match(image)
        if m and m.group(1) in ("docker", "docker-daemon"):
            return reference_problem(m.group(2))
        if m or image.startswith(("/", "./", "../")) or image.endswith(".sif"):
            return None
        return (f"{image!r} is not an apptainer image: give a SIF file or sandbox directory (/images/sglang.sif) "
                f"or a URI such as docker://lmsysorg/sglang:v0.5.3-cu126")

    def command(self, c: Container, run: Run, inner: tuple[str, ...]) -> tuple[str, ...]:
        argv = [self.program, *c.options, "exec"]
        if c.gpus == "all" or (c.gpus == "auto" and run.gpus):
            argv.append("--nv")
        argv += [a for m in c.mounts for a in ("--bind", mount_text(m.source, m.target, m.readonly))]
        argv += [a for k, v in c.env.items() for a in ("--env", f"{k}={v}")]
        if c.workdir:
            argv += ["--cwd", c.workdir]
        return (*argv, *c.args, c.image, *inner)


APPTAINER = Apptainer("apptainer", "apptainer", image_forms="a .sif file, a sandbox directory or docker://REF")
