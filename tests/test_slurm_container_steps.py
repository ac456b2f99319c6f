"""Container steps on the real test SLURM (scripts/slurm_local.sh): real srun parses the pyxis
lines epdctl renders (a SPANK plugin registering pyxis's own option table records what srun
handed it), and SLURM's own OCI support runs a step in a bundle through runc (oci.conf)."""

from __future__ import annotations

import json
import re
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from slurm_cluster import SLURM_DIR, SlurmCluster, slurm_cluster

from epdctl.render import build_plan
from epdctl.topology import topology_from_text

ROOT = Path(__file__).resolve().parents[1]
QWEN = (ROOT / "topologies" / "qwen2vl-epd.yaml").read_text()


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    if shutil.which("slurmctld") is None or os.geteuid() != 0:
        _missing("root and SLURM (scripts/test.sh installs it)")
    yield from slurm_cluster()


def _missing(what: str) -> None:
    """Outside CI a machine without the test set-up skips; CI installs it (scripts/test.sh), so there
    a missing piece fails."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must have {what}")
    pytest.skip(what)


def _pyxis_options() -> list[tuple[str, ...]]:
    doc = yaml.safe_load(QWEN)
    doc.update(launcher="slurm", slurm={"partition": "gpu"},
               container={"image": "nvcr.io#nvidia/pytorch:24.01-py3", "runtime": "pyxis",
                          "mounts": ["/lustre/logs:/logs", "/models:/models:ro"],
                          "env": {"NCCL_DEBUG": "INFO"}, "workdir": "/logs"})
    plan = build_plan(topology_from_text(yaml.safe_dump(doc, sort_keys=False)))
    return [w.step_options for w in plan.workers]


def test_real_srun_accepts_the_rendered_pyxis_options(slurm: SlurmCluster, tmp_path: Path) -> None:
    if "spank_pyxis_options.so" not in (SLURM_DIR / "plugstack.conf").read_text():
        _missing("the SPANK plugin (libslurm-dev's spank.h and gcc; scripts/slurm_local.sh builds it)")
    for options in _pyxis_options()[:3]:
        record = tmp_path / "record.txt"
        record.unlink(missing_ok=True)
        env = dict(os.environ, SLURM_CONF=str(slurm.conf), EPD_SPANK_RECORD=str(record))
        proc = subprocess.run(["srun", "--nodes=1", "--ntasks=1", *options, "true"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        by_callback = {(cb, val): name for name, val, cb in _pyxis_callbacks()}
        seen = {}
        for line in record.read_text().splitlines():
            cb, val, arg = (line.split(" ", 2) + [""])[:3]
            seen[by_callback[(cb, int(val))]] = arg
        given = dict((o[2:].split("=", 1) + [""])[:2] for o in options)
        assert seen == given, (seen, given)
    bad = subprocess.run(["srun", "--nodes=1", "--ntasks=1", "--container-imagex=x", "true"],
                         env=dict(os.environ, SLURM_CONF=str(slurm.conf)), capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode != 0 and "container-imagex" in bad.stderr  # srun refuses what no plugin registered


def test_slurm_oci_runs_a_step_in_a_runc_bundle(slurm: SlurmCluster, tmp_path: Path) -> None:
    """``srun --container=BUNDLE`` as the slurm-oci runtime renders it: a bundle whose rootfs is an
    empty skeleton with the host's /usr bind-mounted read-only; the step's cwd and PATH are SLURM's."""
    if shutil.which("runc") is None or not (SLURM_DIR / "oci.conf").exists():
        _missing("runc and the test SLURM's oci.conf (scripts/test.sh)")
    bundle = tmp_path / "bundle"
    rootfs = bundle / "rootfs"
    for d in ("usr", "proc", "dev", "tmp", "etc"):
        (rootfs / d).mkdir(parents=True)
    for d in ("bin", "lib", "lib64", "sbin"):
        (rootfs / d).symlink_to(f"usr/{d}")
    spec = json.loads(_runc_spec(bundle))
    spec["process"]["terminal"] = False
    spec["root"] = {"path": "rootfs", "readonly": False}
    spec["mounts"] += [{"destination": d, "type": "bind", "source": d, "options": ["rbind", "ro"]}
                       for d in ("/usr", "/etc")]
    spec["linux"]["namespaces"] = [n for n in spec["linux"]["namespaces"] if n["type"] != "network"]
    (bundle / "config.json").write_text(json.dumps(spec))
    doc = yaml.safe_load(QWEN)
    doc.update(launcher="slurm", slurm={"partition": "gpu"}, container={"image": str(bundle), "runtime": "slurm-oci"})
    options = build_plan(topology_from_text(yaml.safe_dump(doc, sort_keys=False))).workers[0].step_options
    assert options == (f"--container={bundle}",)
    proc = subprocess.run(["srun", "--nodes=1", "--ntasks=1", *options, "/usr/bin/readlink", "/proc/self/ns/mnt"],
                          env=dict(os.environ, SLURM_CONF=str(slurm.conf)), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith("mnt:[") and proc.stdout.strip() != os.readlink("/proc/self/ns/mnt")


def _pyxis_callbacks() -> list[tuple[str, int, str]]:
    """(option, val, callback) of every entry of pyxis's spank_opts."""
    text = (ROOT / "tests" / "fixtures" / "containers" / "pyxis_spank_opts.c").read_text()
    return [(name, int(val), cb) for name, val, cb in
            re.findall(r'\{\s*"([a-z-]+)",.*?\n\s*\d, (\d+), (spank_option_\w+)\s*\}', text, re.S)]


def _runc_spec(bundle: Path) -> str:
    subprocess.run(["runc", "spec", "--bundle", str(bundle)], check=True, capture_output=True)
    text = (bundle / "config.json").read_text()
    (bundle / "config.json").unlink()
    return text
