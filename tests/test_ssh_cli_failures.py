"""The ssh launcher's first use and partial failures, through the real CLI in a subprocess.

Real sshd daemons on 127.0.0.2..4 (tests/sshd_nodes.py); no torch: `up` is stopped by its own
preflight (an unreachable node, or a node that declares 64 GPUs) before anything starts, and
`status`/`logs` run against trivial HTTP workers the ssh launcher started on the nodes.
Covered: `up --accept-new-host-keys` against nodes never seen (the preflight records their
keys the way the launcher does and never says "versions differ" for a node it could not
reach); one unreachable node in `status` (text and --json) and `logs`; `status`/`down` from a
shell without the known-hosts setting `up` used.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import pytest
import yaml

from conftest_ssh import processes_with, sshd, target  # noqa: F401  (fixture)
from sshd_nodes import SshdNodes

from epdctl.launchers.ssh import SSHLauncher
from epdctl.launchers.ssh.conn import SSHOptions
from epdctl.launchers.ssh.nodes import NodeAccess
from epdctl.state.store import ClusterDir, ClusterState, ProcessRecord

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "docs" / "status.schema.json").read_text())
TOPOLOGY = ROOT / "topologies" / "ssh-3node.yaml"
OK_SERVER = ("import sys, http.server as h\n"
             "class H(h.BaseHTTPRequestHandler):\n"
             "    def do_GET(self):\n"
             "        self.send_response(200); self.end_headers(); self.wfile.write(b'ok')\n"
             "    def log_message(self, *a): print('GET', flush=True)\n"
             "print('serving', flush=True)\n"
             "h.HTTPServer((sys.argv[1], int(sys.argv[2])), H).serve_forever()\n")


@pytest.fixture(scope="module")
def sshd_port() -> int:
    return 35322  # not used by any other suite


def topology(tmp: Path, nodes: SshdNodes, **changes: dict[str, Any]) -> Path:
    """topologies/ssh-3node.yaml on the test daemons, running this worktree's epdctl."""
    doc = yaml.safe_load(TOPOLOGY.read_text())
    doc["model"]["path"] = str((TOPOLOGY.parent / doc["model"]["path"]).resolve())
    doc["ports"] = {"base": 35400, "limit": 35499}
    for node in doc["nodes"]:
        node["ssh"].update(user=nodes.user, port=nodes.port, key=str(nodes.client_key))
        node["setup"] = [f"export PATH={Path(sys.executable).parent}:$PATH",
                         f"export PYTHONPATH={ROOT}"]
        extra = dict(changes.get(node["name"], {}))
        node["ssh"].update(extra.pop("ssh", {}))
        node.update(extra)
    out = tmp / "ssh-3node.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epdctl", *args], env=env, cwd=ROOT, text=True,
                          capture_output=True, timeout=300)


def fresh_env(tmp: Path) -> tuple[dict[str, str], Path]:
    """A shell that has never seen the nodes: an empty known_hosts, a HOME without ~/.ssh."""
    kh = tmp / "known_hosts"
    kh.write_text("")
    (tmp / "home").mkdir(exist_ok=True)
    env = dict(os.environ, HOME=str(tmp / "home"), EPDCTL_STATE_DIR=str(tmp / "state"),
               EPDCTL_KNOWN_HOSTS=str(kh), EPDCTL_SSH_CONFIG="", EPDCTL_SSH_TIMEOUT="10",
               EPDCTL_SSH_RUN_ROOT=str(tmp / "remote"), PYTHONPATH=str(ROOT))
    env.pop("EPDCTL_SSH_ACCEPT_NEW_HOST_KEYS", None)
    return env, kh


def recorded(kh: Path) -> set[tuple[str, str]]:
    """(host, base64 key) of every line of a known_hosts file."""
    return {(f[0], f[2]) for f in (ln.split() for ln in kh.read_text().splitlines()) if f}


# ---- `up` against nodes never seen -------------------------------------------------------

def test_accept_new_host_keys_reaches_fresh_nodes_and_records_their_keys(sshd, tmp_path):
    """Every node is new; node-c is reached through node-a. The preflight honours the flag
    (keys recorded in the first known_hosts file, as the launcher records them), so the only
    failure is the real one: node-b declares 64 GPUs."""
    env, kh = fresh_env(tmp_path)
    topo = topology(tmp_path, sshd, **{"node-b": {"gpus": 64}})
    up = cli("up", str(topo), "--accept-new-host-keys", "--no-canary", env=env)
    out = up.stdout + up.stderr
    assert up.returncode == 1 and "Traceback" not in out, out
    assert "preflight: 1 of " in out and "[node-b] gpus:" in out, out
    assert "differ" not in out and "unknown host key" not in out, out
    assert "nothing was started" in out
    assert recorded(kh) == {(f"[{n.host}]:{sshd.port}", n.host_key_pub.split()[1])
                            for n in sshd.nodes}
    assert ClusterDir("ssh-3node", tmp_path / "state").load() is None


def test_unreachable_fresh_node_is_named_never_versions_differ(sshd, tmp_path):
    """node-c has no sshd at its port: the preflight names it unreachable, records the keys
    of the nodes it reached and compares versions only among them."""
    env, kh = fresh_env(tmp_path)
    topo = topology(tmp_path, sshd, **{"node-c": {"ssh": {"port": 35098, "jump": None}}})
    up = cli("up", str(topo), "--accept-new-host-keys", env=env)
    out = up.stdout + up.stderr
    assert up.returncode == 1 and "Traceback" not in out, out
    assert "preflight: 1 of " in out, out
    assert "[node-c] unreachable: cannot connect to 127.0.0.4:35098: connection refused" in out
    assert "differ" not in out and "nothing was started" in out
    assert {line.split()[0] for line in kh.read_text().splitlines()} == {
        f"[127.0.0.2]:{sshd.port}", f"[127.0.0.3]:{sshd.port}"}


def test_without_the_flag_every_new_node_is_named_with_the_way_out(sshd, tmp_path):
    env, kh = fresh_env(tmp_path)
    up = cli("up", str(topology(tmp_path, sshd)), env=env)
    out = up.stdout + up.stderr
    assert up.returncode == 1 and "Traceback" not in out, out
    assert "differ" not in out, out
    for node, host in (("node-a", "127.0.0.2"), ("node-b", "127.0.0.3")):
        assert f"[{node}] unreachable: unknown host key for [{host}]:{sshd.port}" in out, out
    assert "--accept-new-host-keys" in out and kh.read_text() == ""


# ---- one unreachable node: status and logs show the others ---------------------------------

@pytest.fixture()
def running(tmp_path: Path) -> Iterator[tuple[SshdNodes, dict[str, str], ClusterState, str]]:
    """Own daemons (one is stopped by the test), a cluster recorded as `up` records it: one
    HTTP worker per node, started by the ssh launcher with host keys from EPDCTL_KNOWN_HOSTS."""
    nodes = SshdNodes(tmp_path / "sshd", 3, port=35323)
    nodes.start()
    env, _ = fresh_env(tmp_path)
    env["EPDCTL_KNOWN_HOSTS"] = str(nodes.known_hosts)
    marker = f"epd-s4a-{uuid.uuid4().hex}"
    names = ("node-a", "node-b", "node-c")
    access = {n: NodeAccess(n, target(nodes, i, node=n), (f"export PYTHONPATH={ROOT}",),
                            sys.executable) for i, n in enumerate(names)}
    cdir = ClusterDir("ssh-3node", tmp_path / "state")
    state = ClusterState(name="ssh-3node", topology=str(tmp_path / "t.yaml"), launcher="ssh",
                         phase="running")
    for i, (node, role) in enumerate(zip(names, ("encoder", "prefill", "decode"))):
        host, port = nodes.nodes[i].host, 35410 + i
        state.processes.append(ProcessRecord(
            name=f"{role}-0", role=role, node=node, host=host, port=port,
            url=f"http://{host}:{port}", log=str(cdir.log(f"{role}-0")),
            argv=[sys.executable, "-c", OK_SERVER, host, str(port), marker]))
    opts = SSHOptions(known_hosts=(str(nodes.known_hosts),), ssh_config=None)
    with SSHLauncher(cdir.root, nodes=access, cluster="ssh-3node", options=opts,
                     run_root=env["EPDCTL_SSH_RUN_ROOT"]) as lau:
        res = lau.start(state.processes)
        assert res.all_ok, res.failed
    for rec in state.processes:
        rec.handle = res.ok[rec.name]
    cdir.save(state)
    try:
        yield nodes, env, state, marker
    finally:
        with SSHLauncher(cdir.root, options=opts) as lau:
            lau.stop(state.processes, grace=2)
        for p in processes_with(marker):  # on a node whose sshd the test stopped
            p.kill()
        nodes.stop()


def wait_serving(env: dict[str, str]) -> None:
    """Until `status` exits 0: every worker has bound its ports (30 s at most)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        st = cli("status", "ssh-3node", "--json", env=env)
        if st.returncode == 0:
            return
        time.sleep(0.5)
    raise AssertionError(st.stdout + st.stderr)


def test_status_and_logs_with_one_node_unreachable_show_the_others(running):
    nodes, env, state, marker = running
    wait_serving(env)
    os.kill(nodes.nodes[1].pid, signal.SIGTERM)  # node-b's sshd (its worker keeps running)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(nodes.nodes[1].pid, 0)
            time.sleep(0.1)
        except ProcessLookupError:
            break
    st = cli("status", "ssh-3node", "--json", env=env)
    assert st.returncode == 1 and "Traceback" not in st.stderr, st.stderr
    jsonschema.validate(json.loads(st.stdout), SCHEMA)  # alive null is documented
    rows = {w["name"]: w for w in json.loads(st.stdout)["workers"]}
    assert set(rows) == {"encoder-0", "prefill-0", "decode-0"}
    assert rows["encoder-0"]["healthy"] and rows["decode-0"]["healthy"]
    b = rows["prefill-0"]
    assert b["healthy"] is False and b["alive"] is None, b
    assert b["health"].startswith("unreachable: cannot connect to 127.0.0.3:35323"), b
    text = cli("status", "ssh-3node", env=env)
    assert text.returncode == 1 and "Traceback" not in text.stderr, text.stderr
    line = next(ln for ln in text.stdout.splitlines() if ln.startswith("prefill-0"))
    assert "UNREACHABLE" in line and "DEAD" not in line, text.stdout
    assert "node-b: unreachable: cannot connect to 127.0.0.3:35323" in text.stdout, text.stdout
    for other in ("encoder-0", "decode-0"):
        assert "healthy" in next(ln for ln in text.stdout.splitlines() if ln.startswith(other))
    logs = cli("logs", "-c", "ssh-3node", env=env)
    assert logs.returncode == 1 and "Traceback" not in logs.stderr, logs.stderr
    assert "[encoder-0] serving" in logs.stdout and "[decode-0] serving" in logs.stdout
    assert "[prefill-0] [node-b] cannot connect to 127.0.0.3:35323" in logs.stderr, logs.stderr
    # the worker on the unreachable node was never taken for dead
    assert len(processes_with(marker)) == 3


def test_status_and_down_from_a_shell_without_the_known_hosts_setting(running):
    """`up` ran with EPDCTL_KNOWN_HOSTS; this shell has neither it nor a ~/.ssh: the file is
    recorded in the run folder (no secret in it), so keys are verified the same way."""
    nodes, env, state, marker = running
    other = {k: v for k, v in env.items() if k != "EPDCTL_KNOWN_HOSTS"}
    doc = json.loads((Path(env["EPDCTL_STATE_DIR"]) / "clusters" / "ssh-3node"
                      / "ssh-nodes.json").read_text())
    assert doc["known_hosts"][0] == str(nodes.known_hosts)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        st = cli("status", "ssh-3node", "--json", env=other)
        if st.returncode == 0:
            break
        time.sleep(0.5)
    assert st.returncode == 0, st.stdout + st.stderr
    down = cli("down", "ssh-3node", env=other)
    assert down.returncode == 0, down.stdout + down.stderr
    assert processes_with(marker) == []
