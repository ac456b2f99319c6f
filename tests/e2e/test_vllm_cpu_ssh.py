"""topologies/vllm-cpu-epd.yaml over three real sshd nodes (`launcher: ssh`): vLLM's own
encoder, prefill and decode servers, each started detached on its own node (127.0.0.2-4, the
engine venv on the node as on GPU nodes), epdctl's E->P->D router on node-a. One cluster for
the module.

The nodes share this machine's filesystem, marked ``shared: true``: the store where the encoder
writes embeddings and the prefill KV blocks is one directory all three see. `check` knows the
engine on each node (its release, the store, the ports); `up`'s canary proves the transfers; an
OpenAI client's 3-image request is answered right; `status` shows the three vLLM workers with
figures from their own /metrics; `down` removes the store on the nodes (over ssh) and leaves no
process. Own sshd port 32100; cluster ports 32110-32159. About 6.3 GiB.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from conftest_ssh import sshd  # noqa: F401  (fixture)
from sshd_nodes import SshdNodes
from vllm_cluster import (VllmCluster, ask_three_images, check_canary, check_down, check_status,
                          require_engine, topology_doc)

require_engine()

NAME, BASE = "vllm-cpu-ssh", 32110
NODE_OF = {"encoder-0": "node-a", "prefill-0": "node-b", "decode-0": "node-c"}


@pytest.fixture(scope="module")
def sshd_port() -> int:
    return 32100


@pytest.fixture(scope="module")
def cluster(sshd: SshdNodes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmCluster]:
    tmp = tmp_path_factory.mktemp("vllm-ssh")
    doc = topology_doc(NAME, tmp / "store")
    doc["launcher"] = "ssh"
    doc["python"] = "python3"  # as found on the node after its setup line
    doc["ports"] = {"base": BASE, "limit": BASE + 49}
    doc.setdefault("defaults", {})["host"] = "node"  # every worker listens on its node's address
    doc["nodes"] = [{"name": name, "host": n.host, "shared": True,
                     "ssh": {"user": sshd.user, "port": n.port, "key": str(sshd.client_key)},
                     "setup": [f"export PATH={Path(sys.executable).parent}:$PATH"]}
                    for name, n in zip(("node-a", "node-b", "node-c"), sshd.nodes)]
    doc["roles"] = {role: {"nodes": [node], "count": 1} for role, node in
                    (("encoder", "node-a"), ("prefill", "node-b"), ("decode", "node-c"))}
    doc["router"] = {"node": "node-a", "host": sshd.nodes[0].host, "implementation": "epdctl-epd"}
    topo = tmp / f"{NAME}.yaml"
    topo.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp / "state"), EPDCTL_KNOWN_HOSTS=str(sshd.known_hosts),
               EPDCTL_SSH_CONFIG="", EPDCTL_SSH_RUN_ROOT=str(tmp / "nodes"))
    c = VllmCluster(NAME, topo, tmp / "store", env)
    c.extra["check"] = c.epdctl("check", str(topo), "--json", timeout=300)
    try:
        c.bring_up()
        print(f"up to serving over ssh: {c.seconds_to_up:.1f}s")
        yield c
    finally:
        c.stop()


def test_check_knows_the_engine_store_and_ports_on_each_node(cluster: VllmCluster) -> None:
    proc = cluster.extra["check"]
    doc = json.loads(proc.stdout)
    assert doc["ok"], proc.stdout + proc.stderr
    items = {(i["node"], i["check"]): i for i in doc["checks"]}
    for node in NODE_OF.values():
        assert "vllm 0.32.0+cpu at " in items[(node, "engine")]["detail"], items[(node, "engine")]
        store = items[(node, "transfer store")]["detail"]
        assert f"{cluster.store} (made by `up`) on storage shared by node-a, node-b, node-c" in store, store
        assert items[(node, "ports")]["ok"], items[(node, "ports")]


def test_up_canary_proves_embeddings_and_kv_moved(cluster: VllmCluster) -> None:
    assert cluster.up is not None
    print(cluster.up.stdout)
    check_canary(cluster.up.stdout)
    assert "OpenAI endpoint: http://127.0.0.2:" in cluster.up.stdout


def test_openai_client_three_images_answered_right(cluster: VllmCluster) -> None:
    ask_three_images(cluster.router_url, seed=2811)


def test_status_shows_three_vllm_workers_with_their_metrics(cluster: VllmCluster) -> None:
    check_status(cluster, NODE_OF, "ssh")


def test_down_leaves_no_process_and_no_store(cluster: VllmCluster) -> None:
    check_down(cluster, ["node-a", "node-b", "node-c"])
    assert list((Path(cluster.env["EPDCTL_SSH_RUN_ROOT"]) / NAME).rglob("*.json")) == []  # node records gone
