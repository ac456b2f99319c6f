"""topologies/local-container.yaml through the real CLI: every worker in a podman container
(the Debian image scripts/build_container_image.sh builds offline), the quick start's canary
answered through them, `status` showing the image, `logs` reading the container's output, and
`down` leaving no container and no process, also with the state damaged. One cluster for the
module; ports 31500-31599."""

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

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "topologies" / "local-container.yaml"
IMAGE = "localhost/epdctl-runtime:bookworm"
PODMAN = ["podman", "--cgroup-manager=cgroupfs", "--events-backend=file"]

pytestmark = pytest.mark.skipif(shutil.which("podman") is None or os.geteuid() != 0,
                                reason="needs rootful podman (scripts/test.sh installs it)")


def _epdctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epdctl", *args], env=env, cwd=ROOT, text=True,
                          capture_output=True, timeout=600)


def _containers(label: str) -> list[str]:
    out = subprocess.run([*PODMAN, "ps", "--all", "--filter", f"label=epdctl.cluster={label}",
                          "--format", "{{.Names}}"], capture_output=True, text=True, check=True).stdout
    return out.split()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], str]]:
    subprocess.run(["bash", str(ROOT / "scripts" / "build_container_image.sh")], check=True, timeout=900)
    tmp = tmp_path_factory.mktemp("container")
    env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp / "state"))
    up = _epdctl(env, "up", str(TOPOLOGY), "--timeout", "600")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield env, up.stdout + up.stderr
    finally:
        _epdctl(env, "down", "local-container", "--force")
        assert _containers("local-container") == []


def test_canary_is_answered_through_containers(cluster: tuple[dict[str, str], str]) -> None:
    _, out = cluster
    assert "verdict:  correct" in out, out


def test_every_worker_runs_inside_its_container(cluster: tuple[dict[str, str], str]) -> None:
    env, _ = cluster
    state = json.loads((Path(env["EPDCTL_STATE_DIR"]) / "clusters" / "local-container" / "state.json").read_text())
    workers = [p for p in state["processes"] if p["role"] != "router"]
    assert len(workers) == 4
    host_mnt = os.readlink("/proc/self/ns/mnt")
    for p in workers:
        name = p["container"]["name"]
        pid = int(subprocess.run([*PODMAN, "inspect", "--format", "{{.State.Pid}}", name],
                                 capture_output=True, text=True, check=True).stdout)
        assert os.readlink(f"/proc/{pid}/ns/mnt") != host_mnt, name  # its own mount namespace
        assert "libpod" in Path(f"/proc/{pid}/cgroup").read_text(), name  # podman's cgroup
        inside = psutil.Process(pid).children(recursive=True) + [psutil.Process(pid)]
        served = [q for q in inside if "epdctl.runtime" in q.cmdline()]
        assert served and all(os.readlink(f"/proc/{q.pid}/ns/mnt") != host_mnt for q in served), name
        assert served[0].environ()["EPDCTL_WORKER"] == p["name"]  # the marker reaches the container
    assert sorted(_containers("local-container")) == sorted(p["container"]["name"] for p in workers)


def test_status_shows_the_image_and_its_id(cluster: tuple[dict[str, str], str]) -> None:
    env, _ = cluster
    image_id = subprocess.run([*PODMAN, "image", "inspect", "--format", "{{.Id}}", IMAGE],
                              capture_output=True, text=True, check=True).stdout.strip()
    doc = json.loads(_epdctl(env, "status", "local-container", "--json").stdout)
    images = {w["name"]: (w["image"], w["image_digest"]) for w in doc["workers"]}
    assert images.pop("router") == ("", "")  # the router runs on the host
    assert set(images.values()) == {(IMAGE, image_id)}, images
    text = _epdctl(env, "status", "local-container").stdout
    assert f"{IMAGE} (sha256:{image_id[:12]}): encoder-0, encoder-1, prefill-0, decode-0" in text, text


def test_logs_read_the_containers_output(cluster: tuple[dict[str, str], str]) -> None:
    env, _ = cluster
    proc = _epdctl(env, "logs", "prefill-0", "--cluster", "local-container", "--lines", "400")
    out = proc.stdout
    assert "prefill INFO epdctl.runtime" in out and "listening on http://127.0.0.1:315" in out, proc.stderr


@pytest.mark.parametrize("broken, expect", [
    ({"image": "localhost/epdctl-no-such-image:1"}, "localhost/epdctl-no-such-image"),
    ({"mounts": ["/nonexistent/epdctl-mount:/data"]}, "/nonexistent/epdctl-mount: no such file or directory"),
], ids=["bad-image", "missing-mount"])
def test_a_container_that_exits_at_once_is_reported_with_its_error(tmp_path: Path, broken: dict,
                                                                     expect: str) -> None:
    env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp_path / "state"))
    doc = yaml.safe_load(TOPOLOGY.read_text())
    doc.update(name="ctr-broken", python=str(ROOT / ".venv" / "bin" / "python"),
               model={**doc["model"], "path": str(ROOT / "models" / "tiny-qwen2vl")},
               ports={"base": 31550, "limit": 31599})
    doc["container"]["mounts"] = [{"source": str(ROOT), "readonly": True}]
    doc["roles"] = {"encoder": {"nodes": ["local"], "count": 1, "container": broken},
                    "prefill": {"nodes": ["local"], "count": 1}, "decode": {"nodes": ["local"], "count": 1}}
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        up = _epdctl(env, "up", str(path), "--timeout", "120", "--skip-preflight")
        out = up.stdout + up.stderr
        assert up.returncode != 0, out
        assert "[local/encoder-0] exited with status 125" in out and expect in out, out
        assert "Traceback" not in out
    finally:
        _epdctl(env, "down", "ctr-broken", "--force")
    assert _containers("ctr-broken") == [] and cluster_processes("ctr-broken") == []


def test_zz_down_with_damaged_state_leaves_nothing(cluster: tuple[dict[str, str], str]) -> None:
    """Last: the state file is damaged, `down --force` finds the containers by marker and label."""
    env, _ = cluster
    state = Path(env["EPDCTL_STATE_DIR"]) / "clusters" / "local-container" / "state.json"
    state.write_text("{ damaged")
    down = _epdctl(env, "down", "local-container", "--force")
    assert down.returncode == 0, down.stdout + down.stderr
    assert _containers("local-container") == []
    assert cluster_processes("local-container") == []
