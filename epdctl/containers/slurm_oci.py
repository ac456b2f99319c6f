"""SLURM's own OCI containers (slurm.schedmd.com/containers.html): ``srun --container=BUNDLE
COMMAND`` runs the step in the OCI bundle through the runtime oci.conf names (runc, crun). The
bundle's config.json holds the mounts and the namespaces (no network namespace: the host's);
SLURM replaces its process arguments with the step's command and appends the job's environment.
The bundle is a directory on the filesystem the login node and the nodes share, so `validate`
sees whether it is there (scripts/build_oci_bundle.py builds one from a podman image)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from epdctl.containers.base import ContainerRuntime, Run
from epdctl.containers.spec import Container

BUILD = "sudo python3 scripts/build_oci_bundle.py --image IMAGE --out {bundle}"


def _shown(text: str) -> str:
    """``text`` as written when printable, else quoted with escapes (a lone surrogate, a control)."""
    return text if text.isprintable() else repr(text)


@dataclass(frozen=True)
class SlurmOci(ContainerRuntime):
    def image_problem(self, image: str) -> str | None:
        if image.startswith("/"):
            return None
        return (f"SLURM's --container takes the absolute path of an OCI bundle directory (config.json and rootfs/), "
                f"or one relative to the topology file (./, ../); got {image!r}")

    def missing(self, c: Container) -> str | None:
        bundle, shown = Path(c.image), _shown(c.image)
        absent = [p for p in ("config.json", "rootfs") if not (bundle / p).exists()]
        if absent:
            what = "no such directory" if not bundle.is_dir() else f"no {' and no '.join(absent)} in it"
            return (f"no OCI bundle at {shown} ({what}): build it with `{BUILD.format(bundle=shown)}` (IMAGE: a "
                    f"podman image, e.g. localhost/epdctl-runtime:bookworm from scripts/build_container_image.sh)")
        try:
            spec = json.loads((bundle / "config.json").read_text())
            have = {(m.get("source"), m.get("destination")) for m in spec.get("mounts", []) if isinstance(m, dict)}
        except (OSError, ValueError, AttributeError) as e:
            return f"{bundle / 'config.json'} is not a readable OCI runtime spec ({e}); rebuild the bundle"
        lacking = [_shown(f"{m.source}:{m.target}" + (":ro" if m.readonly else "")) for m in c.mounts
                   if (m.source, m.target) not in have]
        if lacking:  # SLURM 22.05's --container takes no mounts: the bundle's config.json holds them
            return (f"SLURM cannot add mounts to a container step; the bundle {shown} does not mount "
                    f"{', '.join(lacking)}: rebuild it with "
                    f"`{BUILD.format(bundle=shown)} {' '.join('--mount ' + x for x in lacking)}`")
        return None

    def step_options(self, c: Container, run: Run) -> tuple[str, ...]:
        return (f"--container={c.image}", *c.args)

    def command(self, c: Container, run: Run, inner: tuple[str, ...]) -> tuple[str, ...]:
        return ("srun", *self.step_options(c, run), *inner)


SLURM_OCI = SlurmOci("slurm-oci", "srun", step=True, image_forms="an OCI bundle directory (/bundles/sglang)")
