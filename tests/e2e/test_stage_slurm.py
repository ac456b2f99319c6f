"""`epdctl stage` on the real local SLURM cluster, inside an allocation: every node's copy is a
job step (``srun --jobid J --overlap --nodelist NODE``) on that node.

Each slurmd of the local cluster runs in its own mount namespace (scripts/slurm_local.sh); the
test mounts a tmpfs at the stage folder in each node's namespace, so every node has a disk of
its own, as real machines do. The weights come from a local hub (tests/hub_server.py) through
the real ``huggingface_hub`` client. The tests run in file order and share the allocation.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from hub_server import HubServer
from slurm_cluster import SLURM_DIR, SlurmCluster, script, slurm_cluster

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "topologies" / "slurm-local.yaml"
TINY = ROOT / "models" / "tiny-qwen2vl"
REPO = "epd-test/tiny-qwen2vl"
HUB_PORT = 31802
STAGE = Path("/tmp/epd-stage-31800/slurm-nvme")
SMALL = Path("/tmp/epd-stage-31800/slurm-small")


def _slurmd_pid(node: str) -> int:
    return int((SLURM_DIR / "run" / f"slurmd-{node}.pid").read_text().split()[0])


def _own_namespace(pid: int) -> bool:
    return os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")


def _on_node(node: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nsenter", "-t", str(_slurmd_pid(node)), "-m", "--", *argv], capture_output=True,
                          text=True, timeout=60)


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    gen = slurm_cluster()
    c = next(gen)
    if not all(_own_namespace(_slurmd_pid(n)) for n in c.nodes):  # started by an older slurm_local.sh
        script("down")
        script("up")
    try:
        yield c
    finally:
        for n in c.nodes:
            for folder in (STAGE, SMALL):
                _on_node(n, "umount", str(folder))
        for folder in (STAGE, SMALL):
            shutil.rmtree(folder, ignore_errors=True)
        next(gen, None)


def _mount(node: str, folder: Path, size: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    _on_node(node, "umount", str(folder))
    done = _on_node(node, "mount", "-t", "tmpfs", "-o", f"size={size}", f"epd-{node}", str(folder))
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def job(cluster: SlurmCluster) -> Iterator[str]:
    for n in cluster.nodes:
        _mount(n, STAGE, "64m")
    out = cluster.run("salloc", "--no-shell", "--nodes=3", "--time=00:30:00", timeout=120)
    assert out.returncode == 0, out.stderr
    job_id = next(ln for ln in out.stderr.splitlines() if "Granted job allocation" in ln).rsplit(" ", 1)[1]
    try:
        yield job_id
    finally:
        cluster.run("scancel", job_id)


@pytest.fixture(scope="module")
def hub() -> Iterator[HubServer]:
    with HubServer({REPO: TINY}, port=HUB_PORT) as server:
        yield server


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stage-slurm")


def topology(work: Path, stage: Path, name: str) -> Path:
    doc = yaml.safe_load(TOPOLOGY.read_text())
    doc["name"] = name
    doc["model"] = {"hf": f"{REPO}@main", "cache": str(work / "hf"), "stage": str(stage / "tiny"),
                    "served_name": "tiny-qwen2vl"}
    out = work / f"{name}.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def epdctl(work: Path, job: str, hub: HubServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EPDCTL_STATE_DIR": str(work / "state"), "SLURM_JOB_ID": job, "HF_ENDPOINT": hub.url,
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("TRANSFORMERS_OFFLINE", None)  # set by the runtime's import in this process; it means offline too
    return subprocess.run([sys.executable, "-m", "epdctl", *args], env=env, cwd=ROOT, text=True,
                          capture_output=True, timeout=300)


def allocated(work: Path, name: str) -> dict[str, str]:
    """Topology node -> the SLURM node it was mapped to (the allocation record)."""
    doc = json.loads((work / "state" / "clusters" / name / "slurm-job.json").read_text())
    return {t: v[0] for t, v in doc["nodes"].items()}


def node_sha(node: str, path: Path) -> str:
    proc = _on_node(node, "sha256sum", str(path))
    return proc.stdout.split()[0] if proc.returncode == 0 else ""


def test_stage_inside_the_allocation(cluster: SlurmCluster, job: str, hub: HubServer, work: Path) -> None:
    first = epdctl(work, job, hub, "stage", str(topology(work, STAGE, "stage-slurm")))
    print(first.stdout)  # shown with -rP
    assert first.returncode == 0, first.stdout + first.stderr
    assert hub.fetched(REPO) == {p.name: 1 for p in TINY.iterdir() if p.is_file()}
    where = allocated(work, "stage-slurm")
    assert set(where) == {"n0", "n1", "n2"}
    want = node_sha(where["n0"], STAGE / "tiny" / "model.safetensors")
    assert want
    for t, node in where.items():
        assert f"[{t}] staged and verified" in first.stdout
        assert node_sha(node, STAGE / "tiny" / "model.safetensors") == want
        assert node_sha(node, STAGE / "tiny" / ".epdctl-manifest.json")
    spare = next(n for n in cluster.nodes if n not in where.values())
    assert node_sha(spare, STAGE / "tiny" / "model.safetensors") == ""  # outside the allocation: untouched

    corrupt = _on_node(where["n2"], sys.executable, "-c",
                       "import sys; f = open(sys.argv[1], 'r+b'); f.seek(100); f.write(b'XXXX'); f.close()",
                       str(STAGE / "tiny" / "model.safetensors"))
    assert corrupt.returncode == 0, corrupt.stderr
    again = epdctl(work, job, hub, "stage", str(work / "stage-slurm.yaml"))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "[n2] staged and verified" in again.stdout
    assert "1 re-copied, differed from the manifest: model.safetensors" in again.stdout
    assert node_sha(where["n2"], STAGE / "tiny" / "model.safetensors") == want
    assert hub.fetched(REPO) == {p.name: 1 for p in TINY.iterdir() if p.is_file()}


def test_a_full_node_is_refused_before_any_copy(cluster: SlurmCluster, job: str, hub: HubServer,
                                                work: Path) -> None:
    where = allocated(work, "stage-slurm")
    for t, node in where.items():
        _mount(node, SMALL, "1m" if t == "n1" else "64m")
    full = epdctl(work, job, hub, "stage", str(topology(work, SMALL, "stage-slurm-full")))
    assert full.returncode == 1, full.stdout + full.stderr
    assert "staging refused before copying anything" in full.stderr
    assert "[n1] not enough room" in full.stderr and "[n0]" not in full.stderr and "[n2]" not in full.stderr
    assert "Traceback" not in full.stderr
    for node in where.values():
        assert node_sha(node, SMALL / "tiny" / "model.safetensors") == ""
