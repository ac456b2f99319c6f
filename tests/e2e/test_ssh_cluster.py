"""Three simulated nodes over real SSH: up, a real request, status, a kill, down.

Each node is a real sshd on its own loopback alias (127.0.0.2-4, see tests/sshd_nodes.py);
the workers are real runtime processes (torch) started through those daemons by the ssh
launcher, with the real smg router. `up`, `status` and `down` run through the real CLI in a
subprocess, as a user would (from different shells); the runtime-failure case drives the
lifecycle API (`BringUp`, what `epdctl up` calls) to edit one worker's command line. The tests run in file order and share one cluster; the failure
cases at the end start their own (one at a time, so the machine never holds two).
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

import openai
import psutil
import pytest
import yaml

from conftest_ssh import sshd  # noqa: F401  (fixture)
from sshd_nodes import SshdNodes, keygen

from epdctl import shapes
from epdctl.errors import LaunchError
from epdctl.orchestrate.lifecycle import BringUp
from epdctl.launchers.ssh import SSHLauncher
from epdctl.http.probes import http
from epdctl.state.store import ClusterDir, ClusterState

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "topologies" / "ssh-3node.yaml"
NODE_OF = {"encoder-0": "node-a", "prefill-0": "node-b", "decode-0": "node-c", "router": "node-a"}
ADDRESS = {"node-a": "127.0.0.2", "node-b": "127.0.0.3", "node-c": "127.0.0.4"}
_NODE_HOST = re.compile(r"--host 127\.0\.0\.[234](\s|$)")


@pytest.fixture(scope="module")
def sshd_port() -> int:
    return 35023  # not test_ssh_launcher's 35022: both suites may run at once


def ssh_test_topology(tmp: Path, nodes: SshdNodes, port_base: int = 35100,
                      **ssh: Any) -> Path:
    """topologies/ssh-3node.yaml pointed at the test daemons, key and this venv."""
    doc = yaml.safe_load(TOPOLOGY.read_text())
    doc["model"]["path"] = str((TOPOLOGY.parent / doc["model"]["path"]).resolve())
    doc["ports"] = {"base": port_base, "limit": port_base + 99}
    for node in doc["nodes"]:
        node["ssh"].update(user=nodes.user, port=nodes.port, key=str(nodes.client_key))
        node["ssh"].update(ssh.get(node["name"], {}))
        node["setup"] = [f"export PATH={Path(sys.executable).parent}:$PATH"]
    out = tmp / f"ssh-3node-{port_base}.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


@dataclass
class SshCluster:
    topology: Path
    plan: Any
    cdir: ClusterDir
    state: ClusterState
    env: dict[str, str]
    run_root: Path
    up_output: str

    def epdctl(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "epdctl", *args], env=self.env, cwd=ROOT,
                              text=True, capture_output=True, timeout=300)

    def status(self) -> dict:
        proc = self.epdctl("status", self.state.name, "--json")
        assert proc.stdout, proc.stderr
        return json.loads(proc.stdout)


def _environment(tmp: Path, nodes: SshdNodes) -> dict[str, str]:
    return {"EPDCTL_STATE_DIR": str(tmp / "state"), "EPDCTL_KNOWN_HOSTS": str(nodes.known_hosts),
            "EPDCTL_SSH_CONFIG": "", "EPDCTL_SSH_RUN_ROOT": str(tmp / "nodes")}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


_OWN_PORT = re.compile(r"\b35[12]\d\d\b")  # this module's clusters: ports 35100-35299


def _strays() -> list[str]:
    """Processes serving on the test nodes' addresses with this module's ports (other modules'
    clusters on 127.0.0.2-4, in the side run, use other ports)."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = " ".join(p.info["cmdline"] or ())
            if p.info["status"] != psutil.STATUS_ZOMBIE and _NODE_HOST.search(cmd) and _OWN_PORT.search(cmd):
                out.append(f"{p.pid}: {cmd}")
        except psutil.Error:
            continue
    return out


@pytest.fixture(scope="module")
def ssh_cluster(sshd: SshdNodes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshCluster]:
    """`epdctl up` of the 3-node topology, through the real CLI in a subprocess."""
    from epdctl.render import build_plan
    from epdctl.topology import load_topology

    tmp = tmp_path_factory.mktemp("sshcluster")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in _environment(tmp, sshd).items():
            mp.setenv(k, v)
        topology = ssh_test_topology(tmp, sshd)
        topo = load_topology(topology)
        cdir = ClusterDir(topo.name)
        c = SshCluster(topology, build_plan(topo), cdir, ClusterState(topo.name, str(topology), "ssh"),
                       dict(os.environ), tmp / "nodes", "")
        # No canary: its verdict depends on how far the checkpoint is trained; the request
        # test below checks the path through the router instead.
        up = c.epdctl("up", str(topology), "--timeout", "600", "--no-canary")
        c.up_output = up.stdout + up.stderr
        try:
            assert up.returncode == 0, f"epdctl up failed:\n{c.up_output}"
            c.state = cdir.load()
            yield c
        finally:
            state = cdir.load()
            if state is not None:  # a test failed before `down`: still stop everything
                with SSHLauncher(cdir.root) as lau:
                    lau.stop(state.processes, grace=5)


def test_up_through_the_cli(ssh_cluster: SshCluster) -> None:
    out = ssh_cluster.up_output
    assert "cluster ssh-3node is up in" in out
    assert "OpenAI endpoint: http://127.0.0.2:35101/v1" in out
    assert ssh_cluster.state.launcher == "ssh" and ssh_cluster.state.phase == "running"


def test_workers_run_detached_on_their_own_nodes(ssh_cluster: SshCluster, sshd: SshdNodes) -> None:
    assert {p.name: p.node for p in ssh_cluster.state.processes} == NODE_OF
    for p in ssh_cluster.state.processes:
        h = p.handle
        assert h is not None and _alive(h.pid)
        assert os.getsid(h.pid) == h.pid == h.pgid  # own session: outlives the ssh session
        # The node recorded it: the agent that started it ran in that node's ssh session.
        rec = json.loads((ssh_cluster.run_root / "ssh-3node" / p.node / f"{p.name}.json").read_text())
        assert (rec["pid"], rec["create_time"]) == (h.pid, h.create_time)
        assert p.engine == "embedded" and p.worker == p.name and p.node_rank == 0
    for d in sshd.nodes:  # every node's own sshd let epdctl in
        assert "Accepted publickey" in d.log.read_text()
    on_node = json.loads((ssh_cluster.run_root / "ssh-3node" / "node-b" / "prefill-0.json").read_text())
    assert on_node["ports"] == [35100, 35101, 35102, 35103]  # http, KV bootstrap, encoder registry, transfer


def test_request_through_the_router(ssh_cluster: SshCluster) -> None:
    pngs, question, items = shapes.make_request(random.Random(7), 2, plain=True)
    parts: list[dict] = [{"type": "image_url", "image_url": {
        "url": "data:image/png;base64," + base64.b64encode(p).decode()}} for p in pngs]
    parts.append({"type": "text", "text": question})
    client = openai.OpenAI(base_url=ssh_cluster.plan.router.url + "/v1", api_key="unused",
                           max_retries=0, timeout=300)
    resp = client.chat.completions.create(model="tiny-qwen2vl", max_tokens=32, temperature=0,
                                          messages=[{"role": "user", "content": parts}])
    # The checkpoint may still be training, so the words are not judged here, only that an
    # answer came back and that the image went through the encoder on node-a.
    assert isinstance(resp.choices[0].message.content, str)
    assert resp.usage is not None and resp.usage.completion_tokens > 0
    metrics = http("GET", ssh_cluster.state.find("encoder-0").url + "/metrics").body.decode()
    served = re.search(r'^epd_encoder_requests_total\{outcome="200"\} (\d+)', metrics, re.M)
    assert served and int(served.group(1)) >= 1, metrics


def test_status_from_another_shell(ssh_cluster: SshCluster) -> None:
    doc = ssh_cluster.status()
    assert doc["launcher"] == "ssh" and doc["healthy"] is True
    assert {w["name"]: (w["node"], w["alive"], w["health"]) for w in doc["workers"]} == {
        n: (node, True, "ok") for n, node in NODE_OF.items()}


def test_worker_killed_behind_our_back_is_dead_with_its_log_tail(ssh_cluster: SshCluster) -> None:
    rec = ssh_cluster.state.find("decode-0")
    os.killpg(rec.handle.pgid, signal.SIGKILL)
    t0 = time.monotonic()
    while _alive(rec.pid) and time.monotonic() - t0 < 60:  # a stop for a hung test, not a claim
        time.sleep(0.2)
    proc = ssh_cluster.epdctl("status", ssh_cluster.state.name, "--json")
    assert proc.returncode == 1, proc.stderr
    rows = {w["name"]: w for w in json.loads(proc.stdout)["workers"]}
    assert rows["decode-0"]["alive"] is False and rows["decode-0"]["health"] == "dead"
    assert all(rows[n]["alive"] for n in ("encoder-0", "prefill-0", "router"))
    remote = (ssh_cluster.run_root / "ssh-3node" / "node-c" / "decode-0.log").read_text()
    tail = rows["decode-0"]["log_tail"].splitlines()
    assert tail and tail[-1] == remote.splitlines()[-1]


def test_down_from_another_shell_leaves_nothing(ssh_cluster: SshCluster) -> None:
    proc = ssh_cluster.epdctl("down", ssh_cluster.state.name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for p in ssh_cluster.state.processes:
        assert not _alive(p.pid), f"{p.name} (pid {p.pid}) survived down"
    assert _strays() == []
    assert list((ssh_cluster.run_root / "ssh-3node").rglob("*.json")) == []  # node records gone


# ---- failures: each a [node] error, the others reported, nothing left running -------------

def test_bad_nodes_are_all_reported_before_anything_starts(sshd: SshdNodes, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    env = _environment(tmp_path, sshd)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    keygen(tmp_path / "stranger_key")
    kh = tmp_path / "known_hosts"  # node-b's recorded key is someone else's
    lines = sshd.known_hosts.read_text().splitlines()
    kh.write_text("\n".join([lines[0], lines[1].split()[0] + " " + keygen(tmp_path / "impostor"),
                             lines[2]]) + "\n")
    monkeypatch.setenv("EPDCTL_KNOWN_HOSTS", str(kh))
    topology = ssh_test_topology(tmp_path, sshd, port_base=35200,
                                 **{"node-b": {}, "node-c": {"port": 35098, "jump": None}})
    proc = subprocess.run([sys.executable, "-m", "epdctl", "up", str(topology)], cwd=ROOT,
                          text=True, capture_output=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    msg = proc.stderr.strip().removeprefix("error: ")
    # the preflight reaches the nodes as the launcher does, and names every bad one
    assert msg.startswith("preflight: 2 of "), msg
    assert "\n  [node-b] unreachable: HOST KEY MISMATCH for [127.0.0.3]:35023" in msg
    assert "\n  [node-c] unreachable: cannot connect to 127.0.0.4:35098: connection refused" in msg
    assert "[node-a]" not in msg and "\nnothing was started" in msg
    assert _strays() == []


def test_runtime_that_fails_on_one_node_stops_the_others(sshd: SshdNodes, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """prefill-0's model path does not exist on node-b: its log says so, encoder-0 is stopped."""
    from epdctl.render import build_plan
    from epdctl.topology import load_topology

    for k, v in _environment(tmp_path, sshd).items():
        monkeypatch.setenv(k, v)
    topo = load_topology(ssh_test_topology(tmp_path, sshd, port_base=35200))
    plan = build_plan(topo)
    missing = str(tmp_path / "not-on-this-node")
    plan = replace(plan, workers=[
        replace(w, argv=tuple(missing if a == topo.model.path else a for a in w.argv))
        if w.name == "prefill-0" else w for w in plan.workers])
    cdir = ClusterDir(topo.name)
    state = ClusterState(name=topo.name, topology=str(topo.source), launcher="ssh")
    cdir.save(state)
    with SSHLauncher(cdir.root, topo) as lau:
        with pytest.raises(LaunchError) as e:
            BringUp(lau, cdir, state, timeout=600).run(plan)
    msg = str(e.value)
    assert msg.startswith("[node-b/prefill-0] ")
    # Found dead either by the launcher right after its start or by the readiness wait; both
    # name the worker and show its log tail.
    assert ("during startup; last lines of" in msg or "right after start; last lines of" in msg)
    assert missing in msg.split("last lines of", 1)[1]
    # Every role was started at once; prefill-0 is recorded only when it died after the
    # launcher handed it back.
    assert {"encoder-0", "decode-0", "router"} <= {p.name for p in state.processes}
    for p in state.processes:
        assert not _alive(p.pid), f"{p.name} still running after the failed up"
    assert _strays() == []
