"""`epdctl stage` on three real sshd nodes, each with its own local disk.

Each node's sshd runs in its own mount namespace where the stage folder is a private tmpfs
(tests/sshd_nodes.py ``disks``): what one node copies, the others do not see, as on machines
with their own NVMe. The weights come from a local hub (tests/hub_server.py) through the real
``huggingface_hub`` client (``HF_ENDPOINT``); the CLI runs in a subprocess, as a user runs it.
The tests run in file order and share the nodes and the cache.
"""

from __future__ import annotations

import hashlib
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
from sshd_nodes import SshdNodes

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "topologies" / "node-local-staging.yaml"
TINY = ROOT / "models" / "tiny-qwen2vl"
REPO = "epd-test/tiny-qwen2vl"
HUB_PORT = 31801
BASE = Path("/tmp/epd-stage-31800")
STAGE = BASE / "nvme"        # 64 MiB on every node
SMALL = BASE / "small"       # 64 MiB, but 1 MiB on node1: too small for the 8.8 MiB model
NODES = ("node0", "node1", "node2")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdNodes]:
    disks = {n: {str(STAGE): "64m", str(SMALL): "1m" if n == "node1" else "64m"} for n in NODES}
    nodes = SshdNodes(tmp_path_factory.mktemp("sshd"), len(NODES), port=31822, disks=disks)
    nodes.start()
    try:
        yield nodes
    finally:
        nodes.stop()  # the nodes' tmpfs disks end with their namespaces
        shutil.rmtree(BASE, ignore_errors=True)


@pytest.fixture(scope="module")
def hub() -> Iterator[HubServer]:
    with HubServer({REPO: TINY}, port=HUB_PORT) as server:
        yield server


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stage")


def topology(work: Path, nodes: SshdNodes, stage: Path, name: str) -> Path:
    """topologies/node-local-staging.yaml pointed at the test hub repo, daemons, key and venv."""
    doc = yaml.safe_load(TOPOLOGY.read_text())
    doc["name"] = name
    doc["model"].update(hf=f"{REPO}@main", cache=str(work / "hf"), stage=str(stage / "tiny"))
    for node, sn in zip(doc["nodes"], nodes.nodes):
        node.update(name=sn.name, host=sn.host)
        node["ssh"] = {"user": nodes.user, "port": nodes.port, "key": str(nodes.client_key)}
        node["setup"] = [f"export PATH={Path(sys.executable).parent}:$PATH"]
    for role, node in zip(("encoder", "prefill", "decode"), NODES):
        doc["roles"][role]["nodes"] = [node]
    doc["router"].update(node="node0", host=nodes.nodes[0].host)
    out = work / f"{name}.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def epdctl(work: Path, nodes: SshdNodes, hub: HubServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EPDCTL_STATE_DIR": str(work / "state"), "EPDCTL_KNOWN_HOSTS": str(nodes.known_hosts),
           "EPDCTL_SSH_CONFIG": "", "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("TRANSFORMERS_OFFLINE", None)  # set by the runtime's import in this process; it means offline too
    return subprocess.run([sys.executable, "-m", "epdctl", *args], env=env, cwd=ROOT, text=True,
                          capture_output=True, timeout=300)


def node_hashes(nodes: SshdNodes, node: str, folder: Path) -> dict[str, str]:
    """File -> SHA-256 of what ``node``'s own disk holds in ``folder`` ({} when absent)."""
    proc = nodes.on_node(node, sys.executable, "-c", (
        "import hashlib, json, os, sys\n"
        "d = sys.argv[1]\n"
        "out = {}\n"
        "for root, _, names in os.walk(d):\n"
        "    for n in names:\n"
        "        p = os.path.join(root, n)\n"
        "        out[os.path.relpath(p, d)] = hashlib.sha256(open(p, 'rb').read()).hexdigest()\n"
        "print(json.dumps(out))\n"), str(folder))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def tiny_hashes() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in TINY.iterdir() if p.is_file()}


@pytest.fixture(scope="module")
def staged(work: Path, sshd: SshdNodes, hub: HubServer) -> subprocess.CompletedProcess[str]:
    return epdctl(work, sshd, hub, "stage", str(topology(work, sshd, STAGE, "stage-ssh")))


def test_downloads_once_and_stages_every_node(staged: subprocess.CompletedProcess[str], sshd: SshdNodes,
                                              hub: HubServer) -> None:
    print(staged.stdout)  # shown with -rP: what a user sees
    assert staged.returncode == 0, staged.stdout + staged.stderr
    assert hub.fetched(REPO) == {name: 1 for name in tiny_hashes()}, hub.requests
    want = tiny_hashes()
    for node in NODES:
        got = node_hashes(sshd, node, STAGE / "tiny")
        manifest = got.pop(".epdctl-manifest.json")
        assert got == want, node
        assert manifest
        assert f"[{node}] staged and verified" in staged.stdout
        assert f"[{node}] room:" in staged.stdout
    assert "commit " in staged.stdout and "manifest written: 8 files" in staged.stdout
    # the nodes' disks are their own: nothing reached the folder as the control machine sees it
    assert not (STAGE / "tiny").exists()


def test_second_stage_fetches_nothing_and_copies_nothing(staged: subprocess.CompletedProcess[str], work: Path,
                                                         sshd: SshdNodes, hub: HubServer) -> None:
    before = dict(hub.fetched(REPO))
    again = epdctl(work, sshd, hub, "stage", str(work / "stage-ssh.yaml"))
    assert again.returncode == 0, again.stdout + again.stderr
    assert hub.fetched(REPO) == before
    assert "manifest unchanged" in again.stdout
    for node in NODES:
        assert f"[{node}] staged and verified" in again.stdout and "8 already there and verified" in again.stdout


def test_a_corrupted_file_is_found_and_recopied(staged: subprocess.CompletedProcess[str], work: Path,
                                                sshd: SshdNodes, hub: HubServer) -> None:
    target = STAGE / "tiny" / "model.safetensors"
    flip = sshd.on_node("node1", sys.executable, "-c",
                        "import sys; f = open(sys.argv[1], 'r+b'); f.seek(4096); b = f.read(1); f.seek(4096); "
                        "f.write(bytes([b[0] ^ 0xFF])); f.close()", str(target))
    assert flip.returncode == 0, flip.stderr
    assert node_hashes(sshd, "node1", STAGE / "tiny")["model.safetensors"] != tiny_hashes()["model.safetensors"]
    fixed = epdctl(work, sshd, hub, "stage", str(work / "stage-ssh.yaml"))
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "[node1] staged and verified" in fixed.stdout
    assert "1 re-copied, differed from the manifest: model.safetensors" in fixed.stdout
    assert "re-copied" not in "".join(line for line in fixed.stdout.splitlines() if "[node0]" in line)
    got = node_hashes(sshd, "node1", STAGE / "tiny")
    got.pop(".epdctl-manifest.json")
    assert got == tiny_hashes()


def test_a_full_node_is_refused_before_any_copy(staged: subprocess.CompletedProcess[str], work: Path,
                                                sshd: SshdNodes, hub: HubServer) -> None:
    full = epdctl(work, sshd, hub, "stage", str(topology(work, sshd, SMALL, "stage-full")))
    assert full.returncode == 1, full.stdout + full.stderr
    assert "staging refused before copying anything" in full.stderr
    assert "[node1] not enough room" in full.stderr
    assert "[node0]" not in full.stderr and "[node2]" not in full.stderr
    assert "Traceback" not in full.stderr
    for node in NODES:
        assert node_hashes(sshd, node, SMALL) == {}, node
