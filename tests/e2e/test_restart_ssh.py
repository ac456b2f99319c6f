"""kill -9 under load over SSH: the supervisor on the node restarts the worker, no operator.

Three real sshd nodes on 127.0.0.2-4 (tests/sshd_nodes.py), topologies/ssh-3node.yaml with
``restart: {policy: on-failure, backoff: 1.0}`` started by `epdctl up` through the real CLI,
real runtime workers (torch) and the real smg router. Each role's worker in turn (the router
too) is killed with SIGKILL on its node while a client sends image requests through the router
(tests/e2e/kill9_load.py): the service comes back by itself, and `status` from another shell
shows restarts=1 and the cause. The outage is printed (run with -s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from conftest_ssh import sshd  # noqa: F401  (fixture)
from kill9_load import kill_under_load
from sshd_nodes import SshdNodes
from test_ssh_cluster import ssh_test_topology

ROOT = Path(__file__).resolve().parents[2]
NAME = "ssh-3node"
BASE = 35600


@pytest.fixture(scope="module")
def sshd_port() -> int:
    return 35024  # no other suite's daemons


class Cluster:
    def __init__(self, tmp: Path, nodes: SshdNodes):
        topo = ssh_test_topology(tmp, nodes, port_base=BASE)
        doc = yaml.safe_load(topo.read_text())
        doc["restart"] = {"policy": "on-failure", "limit": 5, "backoff": 1.0}
        for node in doc["nodes"]:  # the nodes run this checkout's epdctl
            node["setup"].append(f"export PYTHONPATH={ROOT}")
        topo.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.topology, self.run_root = topo, tmp / "nodes"
        self.env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp / "state"),
                        EPDCTL_KNOWN_HOSTS=str(nodes.known_hosts), EPDCTL_SSH_CONFIG="",
                        EPDCTL_SSH_RUN_ROOT=str(self.run_root), PYTHONPATH=str(ROOT))
        self.router_url = f"http://127.0.0.2:{BASE + 1}"

    def epdctl(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "epdctl", *args], env=env or self.env,
                              cwd=ROOT, text=True, capture_output=True, timeout=300)

    def pid_file(self, node: str, worker: str) -> dict[str, Any]:
        path = self.run_root / NAME / node / f"{worker}.pid.json"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return {}


@pytest.fixture(scope="module")
def cluster(sshd: SshdNodes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("restart-ssh"), sshd)
    up = c.epdctl("up", str(c.topology), "--timeout", "300", "--no-canary")
    try:
        assert up.returncode == 0, f"epdctl up failed:\n{up.stdout}\n{up.stderr}"
        assert f"OpenAI endpoint: {c.router_url}/v1" in up.stdout
        yield c
    finally:
        down = c.epdctl("down", NAME)
        assert down.returncode == 0, down.stdout + down.stderr


NODE_OF = {"encoder-0": "node-a", "prefill-0": "node-b", "decode-0": "node-c", "router": "node-a"}


@pytest.mark.parametrize("worker", list(NODE_OF))
def test_kill_9_over_ssh_recovers_without_an_operator(cluster: Cluster, worker: str) -> None:
    got = kill_under_load(cluster.router_url, lambda: cluster.pid_file(NODE_OF[worker], worker))
    print(f"\nssh {worker}: service back {got.outage_s:.1f}s after kill -9 "
          f"({got.failed_between} failed request(s) in between)")
    assert got.pid_doc["last_exit"] == "killed by signal 9 (SIGKILL)"
    other_shell = {k: v for k, v in cluster.env.items() if k != "EPDCTL_KNOWN_HOSTS"}
    status = cluster.epdctl("status", NAME, "--json", env=other_shell)
    assert status.returncode == 0, status.stdout + status.stderr
    row = next(w for w in json.loads(status.stdout)["workers"] if w["name"] == worker)
    assert row["restarts"] == 1 and row["last_exit"] == "killed by signal 9 (SIGKILL)", row
    assert row["alive"] and row["healthy"]
    text = cluster.epdctl("status", NAME).stdout
    assert f"{worker}: killed by signal 9 (SIGKILL); restarted 1 time(s)" in text, text
