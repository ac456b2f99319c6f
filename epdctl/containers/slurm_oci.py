"""SLURM's own OCI containers (slurm.schedmd.com/containers.html): ``srun --container=BUNDLE
COMMAND`` runs the step in the OCI bundle through the runtime oci.conf names (runc, crun). The
bundle's config.json holds the mounts and the namespaces (no network namespace: the host's);
SLURM replaces its process arguments with the step's command and appends the job's environment."""

from __future__ import annotations

from dataclasses import dataclass

from epdctl.containers.base import ContainerRuntime, Run
from epdctl.containers.spec import Container


@dataclass(frozen=True)
class SlurmOci(ContainerRuntime):
    def image_problem(self, image: str) -> str | None:
        if image.startswith("/"):
            return None
        return (f"SLURM's --container takes the absolute path of an OCI bundle directory (config.json and rootfs/), "
                f"got {image!r}")

    def step_options(self, c: Container, run: Run) -> tuple[str, ...]:
        return (f"--container={c.image}", *c.args)

    def command(self, c: Container, run: Run, inner: tuple[str, ...]) -> tuple[str, ...]:
        return ("srun", *self.step_options(c, run), *inner)


SLURM_OCI = SlurmOci("slurm-oci", "srun", step=True, image_forms="an OCI bundle directory (/bundles/sglang)")
