"""topologies/slurm-oci.yaml through the real CLI on the real local SLURM (scripts/slurm_local.sh):
`up` submits the allocation and starts every worker as a job step ``srun --container=BUNDLE``,
which slurmstepd runs through runc as the test SLURM's oci.conf says; the bundle is the Debian
image (scripts/build_container_image.sh) exported by scripts/build_oci_bundle.py. The quick
start's canary is answered through the containers, each worker's root is the bundle's rootfs,
`status` and `logs` work, and `down` leaves no step, no job, no runc container and no process.
One cluster for the module; ports 32400-32499. Run under `flock /tmp/epd-slurm.lock`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import psutil
import pytest
import yaml

from marked import cluster_processes
from slurm_cluster import SLURM_DIR, SlurmCluster, slurm_cluster

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "topologies" / "slurm-oci.yaml"
BUNDLE = ROOT / ".bundles" / "epdctl-runtime"
RUNC = ["runc", f"--root={SLURM_DIR / 'runc'}"]  # the runtime root oci.conf names
WORKERS = ("encoder-0", "prefill-0", "decode-0")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("podman", "runc", "slurmctld")),
    reason="needs root, podman, runc and SLURM (scripts/test.sh installs them)")


def _epdctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epdctl", *args], env=env, cwd=ROOT, text=True,
                          capture_output=True, timeout=600)


def _runc_containers() -> dict[str, int]:
    """runc's containers under the oci.conf root, running or not: id (node.user.job.step.task) -> init pid."""
    out = subprocess.run([*RUNC, "list", "--format", "json"], capture_output=True, text=True, check=True).stdout
    return {c["id"]: c["pid"] for c in json.loads(out or "null") or []}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], str, SlurmCluster]]:
    subprocess.run(["bash", str(ROOT / "scripts" / "build_container_image.sh")], check=True, timeout=900)
    subprocess.run([sys.executable, str(ROOT / "scripts" / "build_oci_bundle.py")], check=True, timeout=600)
    tmp = tmp_path_factory.mktemp("slurm-oci")
    for slurm in slurm_cluster():
        env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp / "state"))
        env.pop("SLURM_JOB_ID", None)  # `up` submits its own allocation
        up = _epdctl(env, "up", str(TOPOLOGY), "--timeout", "600")
        try:
            assert up.returncode == 0, up.stdout + up.stderr
            yield env, up.stdout + up.stderr, slurm
        finally:
            _epdctl(env, "down", "slurm-oci", "--force")


def test_canary_is_answered_through_slurm_oci_containers(cluster: tuple[dict[str, str], str, SlurmCluster]) -> None:
    _, out, _ = cluster
    assert "verdict:  correct" in out, out


def test_every_worker_runs_in_the_bundle(cluster: tuple[dict[str, str], str, SlurmCluster]) -> None:
    """Each worker step is a runc container (node.user.job.step.task) whose process has the bundle's
    rootfs as its root and a mount namespace of its own; the router runs on the host."""
    env, _, _ = cluster
    state = json.loads((Path(env["EPDCTL_STATE_DIR"]) / "clusters" / "slurm-oci" / "state.json").read_text())
    steps = {p["name"]: p["handle"] for p in state["processes"]}
    job = {h["job"] for h in steps.values()}.pop()
    live = _runc_containers()
    rootfs = os.stat(BUNDLE / "rootfs")
    host_mnt = os.readlink("/proc/self/ns/mnt")
    for name in WORKERS:
        ids = [i for i in live if i.split(".")[2:4] == [job, str(steps[name]["step"])]]
        assert len(ids) == 1, (name, live)
        proc = psutil.Process(live[ids[0]])
        assert "epdctl.runtime" in proc.cmdline(), proc.cmdline()  # bash exec'd the worker in the container
        assert proc.environ()["EPDCTL_WORKER"] == name  # the marker reaches the container
        root = os.stat(f"/proc/{proc.pid}/root")
        assert (root.st_dev, root.st_ino) == (rootfs.st_dev, rootfs.st_ino), name  # its / is the bundle's rootfs
        assert os.readlink(f"/proc/{proc.pid}/ns/mnt") != host_mnt, name
    in_containers = {int(pid) for pid in live.values()}
    router = [p for p in psutil.process_iter() if "smg" in " ".join(_cmdline(p)) and "32401" in _cmdline(p)]
    assert router and all(os.stat(f"/proc/{p.pid}/root").st_ino == os.stat("/").st_ino for p in router)
    assert not in_containers & {p.pid for p in router}


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def test_status_and_logs(cluster: tuple[dict[str, str], str, SlurmCluster]) -> None:
    env, _, _ = cluster
    doc = json.loads(_epdctl(env, "status", "slurm-oci", "--json").stdout)
    assert doc["healthy"] is True
    images = {w["name"]: w["image"] for w in doc["workers"]}
    assert images.pop("router") == ""
    assert set(images.values()) == {str(BUNDLE)}, images
    text = _epdctl(env, "status", "slurm-oci").stdout
    assert f"{BUNDLE}: encoder-0, prefill-0, decode-0" in text, text
    logs = _epdctl(env, "logs", "decode-0", "--cluster", "slurm-oci", "--lines", "400")
    assert "decode INFO epdctl.runtime" in logs.stdout and "listening on http://127.0.0.1:32460" in logs.stdout, \
        logs.stdout + logs.stderr


def test_a_missing_bundle_is_a_validation_error_with_the_build_command(tmp_path: Path) -> None:
    doc = yaml.safe_load(TOPOLOGY.read_text())
    doc["container"]["image"] = str(tmp_path / "no-bundle")
    doc.update(python=str(ROOT / ".venv" / "bin" / "python"), model={**doc["model"], "path": str(ROOT / "models" /
                                                                                             "tiny-qwen2vl")})
    path = tmp_path / "missing.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp_path / "state"))
    for cmd in (("validate", str(path)), ("up", str(path), "--timeout", "60")):
        proc = _epdctl(env, *cmd)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "Traceback" not in out, out
        assert "container.image" in out and f"no OCI bundle at {tmp_path / 'no-bundle'}" in out, out
        assert f"scripts/build_oci_bundle.py --image IMAGE --out {tmp_path / 'no-bundle'}" in out, out
    assert not (tmp_path / "state" / "clusters" / "slurm-oci").exists()  # nothing was submitted


def test_zz_down_leaves_no_step_job_container_or_process(cluster: tuple[dict[str, str], str, SlurmCluster]) -> None:
    env, _, slurm = cluster
    state = json.loads((Path(env["EPDCTL_STATE_DIR"]) / "clusters" / "slurm-oci" / "state.json").read_text())
    job = {p["handle"]["job"] for p in state["processes"]}.pop()
    down = _epdctl(env, "down", "slurm-oci")
    assert down.returncode == 0, down.stdout + down.stderr
    assert slurm.wait_state(job, ("CANCELLED", "COMPLETED", "")) in ("CANCELLED", "COMPLETED", "")
    assert [i for i in _runc_containers() if i.split(".")[2] == job] == []
    assert cluster_processes("slurm-oci") == []
