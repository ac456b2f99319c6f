"""topologies/local-container.yaml's `container:` block over the 3 real sshd nodes
(topologies/ssh-3node.yaml's nodes: encoder on node-a, prefill on node-b, decode on node-c, the
router on node-a's host): each node's podman, started through that node's sshd by the ssh
launcher, runs that node's worker. Through the real CLI: the canary answered, every worker inside
its container (own mount namespace, podman's cgroup), containers labelled with the cluster and
node, `check` probing each node's container, `status` showing the image and its id, `logs`
reading the container's output, a bad image reported with podman's own error, and `down` leaving
no container and no process, also with the state damaged. One cluster for the module; sshd on
port 32300, cluster ports 32310-32389."""

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

from conftest_ssh import sshd  # noqa: F401  (fixture)
from marked import cluster_processes
from sshd_nodes import SshdNodes

ROOT = Path(__file__).resolve().parents[2]
CONTAINER = ROOT / "topologies" / "local-container.yaml"
NODES = ROOT / "topologies" / "ssh-3node.yaml"
IMAGE = "localhost/epdctl-runtime:bookworm"
PODMAN = ["podman", "--cgroup-manager=cgroupfs", "--events-backend=file"]
NAME = "ssh-container"
NODE_OF = {"encoder-0": "node-a", "prefill-0": "node-b", "decode-0": "node-c"}

pytestmark = pytest.mark.skipif(shutil.which("podman") is None or os.geteuid() != 0,
                                reason="needs rootful podman (scripts/test.sh installs it)")


@pytest.fixture(scope="module")
def sshd_port() -> int:
    return 32300


def topology(tmp: Path, nodes: SshdNodes, name: str = NAME, base: int = 32310, limit: int = 32369,
             **roles: dict) -> Path:
    """The container block of local-container.yaml on ssh-3node.yaml's nodes, pointed at the
    test daemons, this venv and the model."""
    doc = yaml.safe_load(NODES.read_text())
    box = yaml.safe_load(CONTAINER.read_text())["container"]
    box["mounts"] = [{"source": str(ROOT), "readonly": True}]
    doc.update(name=name, python=str(Path(sys.executable)), container=box, ports={"base": base, "limit": limit})
    doc["model"]["path"] = str(ROOT / "models" / "tiny-qwen2vl")
    for node in doc["nodes"]:
        node["ssh"].update(user=nodes.user, port=nodes.port, key=str(nodes.client_key))
        node["setup"] = [f"export PATH={Path(sys.executable).parent}:$PATH"]
    for role, extra in roles.items():
        doc["roles"][role].update(extra)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _env(tmp: Path, nodes: SshdNodes) -> dict[str, str]:
    return dict(os.environ, EPDCTL_STATE_DIR=str(tmp / "state"), EPDCTL_KNOWN_HOSTS=str(nodes.known_hosts),
                EPDCTL_SSH_CONFIG="", EPDCTL_SSH_RUN_ROOT=str(tmp / "nodes"))


def _epdctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epdctl", *args], env=env, cwd=ROOT, text=True,
                          capture_output=True, timeout=600)


def _containers(cluster: str, node: str | None = None) -> list[str]:
    where = [f"label=epdctl.cluster={cluster}", *([f"label=epdctl.node={node}"] if node else [])]
    out = subprocess.run([*PODMAN, "ps", "--all", *[a for w in where for a in ("--filter", w)],
                          "--format", "{{.Names}}"], capture_output=True, text=True, check=True).stdout
    return out.split()


@pytest.fixture(scope="module")
def cluster(sshd: SshdNodes, tmp_path_factory: pytest.TempPathFactory  # noqa: F811
            ) -> Iterator[tuple[dict[str, str], str]]:
    subprocess.run(["bash", str(ROOT / "scripts" / "build_container_image.sh")], check=True, timeout=900)
    tmp = tmp_path_factory.mktemp("ctrssh")
    env = _env(tmp, sshd)
    up = _epdctl(env, "up", str(topology(tmp, sshd)), "--timeout", "600")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield env, up.stdout + up.stderr
    finally:
        _epdctl(env, "down", NAME, "--force")
        assert _containers(NAME) == [] and cluster_processes(NAME) == []


def test_canary_is_answered_through_containers_on_three_nodes(cluster: tuple[dict[str, str], str]) -> None:
    _, out = cluster
    assert "verdict:  correct" in out, out


def test_every_worker_runs_inside_its_container_on_its_node(cluster: tuple[dict[str, str], str]) -> None:
    env, _ = cluster
    state = json.loads((Path(env["EPDCTL_STATE_DIR"]) / "clusters" / NAME / "state.json").read_text())
    workers = [p for p in state["processes"] if p["role"] != "router"]
    assert {p["name"]: p["node"] for p in workers} == NODE_OF
    host_mnt = os.readlink("/proc/self/ns/mnt")
    for p in workers:
        name = p["container"]["name"]
        assert _containers(NAME, p["node"]) == [name]  # labelled with its cluster and node
        pid = int(subprocess.run([*PODMAN, "inspect", "--format", "{{.State.Pid}}", name],
                                 capture_output=True, text=True, check=True).stdout)
        assert os.readlink(f"/proc/{pid}/ns/mnt") != host_mnt, name
        assert "libpod" in Path(f"/proc/{pid}/cgroup").read_text(), name
        inside = [pid, *(q.pid for q in psutil.Process(pid).children(recursive=True))]
        served = [q for q in inside if "epdctl.runtime" in psutil.Process(q).cmdline()]
        assert served and all(Path(f"/proc/{q}/root/etc/debian_version").read_text().startswith("12")
                              for q in served), name  # its root is the bookworm image's
        assert psutil.Process(served[0]).environ()["EPDCTL_WORKER"] == p["name"]
        # the podman client runs under the supervisor the node's agent started over ssh
        client = psutil.Process(p["handle"]["pid"])
        assert any(c.name() == "podman" for c in client.children(recursive=True)), name


def test_status_shows_the_image_and_its_id(cluster: tuple[dict[str, str], str]) -> None:
    env, _ = cluster
    image_id = subprocess.run([*PODMAN, "image", "inspect", "--format", "{{.Id}}", IMAGE],
                              capture_output=True, text=True, check=True).stdout.strip()
    doc = json.loads(_epdctl(env, "status", NAME, "--json").stdout)
    rows = {w["name"]: (w["image"], w["image_digest"]) for w in doc["workers"]}
    assert rows.pop("router") == ("", "")
    assert set(rows.values()) == {(IMAGE, image_id)}, rows
    text = _epdctl(env, "status", NAME).stdout
    assert f"{IMAGE} (sha256:{image_id[:12]}): encoder-0, prefill-0, decode-0" in text, text


def test_logs_read_the_containers_output(cluster: tuple[dict[str, str], str]) -> None:
    env, _ = cluster
    proc = _epdctl(env, "logs", "prefill-0", "--cluster", NAME, "--lines", "400")
    assert "prefill INFO epdctl.runtime" in proc.stdout and "listening on http://127.0.0.3:323" in proc.stdout, \
        proc.stdout + proc.stderr


def test_check_probes_each_nodes_container_over_ssh(sshd: SshdNodes, tmp_path: Path,  # noqa: F811
                                                     cluster: tuple[dict[str, str], str]) -> None:
    """`epdctl check`: each node's podman, the image's id there, memlock read inside a probe
    container started through that node's sshd with the worker's options."""
    env, _ = cluster
    image_id = subprocess.run([*PODMAN, "image", "inspect", "--format", "{{.Id}}", IMAGE],
                              capture_output=True, text=True, check=True).stdout.strip()
    proc = _epdctl(env, "check", str(topology(tmp_path, sshd)), "--json")
    items = {(i["node"], i["check"]): i for i in json.loads(proc.stdout)["checks"]}
    for node, worker in ((n, w) for w, n in NODE_OF.items()):
        assert items[(node, "container runtime")]["level"] == "ok"
        assert f"({worker}) present, id sha256:{image_id[:12]}" in items[(node, "container image")]["detail"]
        mem = items[(node, "container memlock")]
        assert mem["level"] == "warn" and "limited to 8192 KiB" in mem["detail"], mem
    assert ("node-a", "container probe") not in items


def test_a_bad_image_is_reported_with_the_runtimes_error(sshd: SshdNodes, tmp_path: Path,  # noqa: F811
                                                          cluster: tuple[dict[str, str], str]) -> None:
    env = _env(tmp_path, sshd)
    path = topology(tmp_path, sshd, name="ssh-ctr-broken", base=32370, limit=32389,
                    decode={"container": {"image": "localhost/epdctl-no-such-image:1"}})
    try:
        up = _epdctl(env, "up", str(path), "--timeout", "120", "--skip-preflight")
        out = up.stdout + up.stderr
        assert up.returncode != 0, out
        assert "[node-c/decode-0] exited with status 125" in out, out
        assert "localhost/epdctl-no-such-image" in out and "Traceback" not in out, out
    finally:
        _epdctl(env, "down", "ssh-ctr-broken", "--force")
    assert _containers("ssh-ctr-broken") == [] and cluster_processes("ssh-ctr-broken") == []


def test_zz_down_with_damaged_state_leaves_nothing(cluster: tuple[dict[str, str], str]) -> None:
    """Last: the state file is damaged; `down --force` finds the processes by marker and the
    containers by label on every node."""
    env, _ = cluster
    assert len(_containers(NAME)) == 3
    state = Path(env["EPDCTL_STATE_DIR"]) / "clusters" / NAME / "state.json"
    state.write_text("{ damaged")
    down = _epdctl(env, "down", NAME, "--force")
    assert down.returncode == 0, down.stdout + down.stderr
    assert _containers(NAME) == []
    assert cluster_processes(NAME) == []
