"""A node that cannot be reached, through the real CLI with real sshd daemons on 127.0.0.2..4.

`down` with one node's sshd stopped: every process on the reachable nodes is stopped, the
unreachable node is named with the reason, its records (only those) stay in the state, the
exit status is non-zero and the message says how to finish; once the node answers again a
second `down` stops what was left and forgets the cluster. `up --force` with an unreachable
node refuses before it starts anything (--force runs past failed checks, not onto nodes it
cannot reach). The cluster is the one tests/test_ssh_cli_failures.py records (`running`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from conftest_ssh import processes_with, sshd  # noqa: F401  (fixture)
from sshd_nodes import SSHD, SshdNodes
from test_ssh_cli_failures import cli, fresh_env, running, sshd_port, topology, wait_serving  # noqa: F401

from epdctl.state.store import ClusterDir


def _stop_sshd(nodes: SshdNodes, i: int) -> None:
    os.kill(nodes.nodes[i].pid, signal.SIGTERM)  # the node's workers keep running
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(nodes.nodes[i].pid, 0)
            time.sleep(0.1)
        except ProcessLookupError:
            return


def _restart_sshd(nodes: SshdNodes, i: int) -> None:
    """The same daemon again (same config and host key); the fixture's teardown stops it."""
    n = nodes.nodes[i]
    conf = nodes.root / n.name / "sshd_config"
    pid_file = nodes.root / n.name / "sshd.pid"
    pid_file.unlink(missing_ok=True)
    subprocess.run([SSHD, "-f", str(conf), "-E", str(n.log)], check=True, capture_output=True)
    deadline = time.monotonic() + 10
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline, f"sshd for {n.name} wrote no pid file"
        time.sleep(0.05)
    nodes.nodes[i] = replace(n, pid=int(pid_file.read_text().split()[0]))


def test_down_with_one_node_unreachable_stops_the_others_and_keeps_its_records(running):
    nodes, env, state, marker = running
    wait_serving(env)
    assert len(processes_with(marker)) == 3
    _stop_sshd(nodes, 1)  # node-b: prefill-0
    down = cli("down", "ssh-3node", env=env)
    out = down.stdout + down.stderr
    assert down.returncode == 1 and "Traceback" not in out, out
    assert "stopped 2 of 3 recorded processes" in out, out
    assert "[node-b] prefill-0: cannot connect to 127.0.0.3:35323" in out, out
    assert "run `epdctl down ssh-3node` to finish" in out, out
    left = processes_with(marker)  # node-a's and node-c's workers are gone; node-b's runs
    assert len(left) == 1 and "127.0.0.3" in " ".join(left[0].cmdline()), left
    cdir = ClusterDir("ssh-3node", Path(env["EPDCTL_STATE_DIR"]))
    kept = cdir.load()
    assert kept is not None and [p.name for p in kept.processes] == ["prefill-0"]
    assert kept.processes[0].handle == next(p for p in state.processes if p.name == "prefill-0").handle
    st = cli("status", "ssh-3node", "--json", env=env)
    assert st.returncode == 1 and "Traceback" not in st.stderr, st.stderr
    assert [w["name"] for w in json.loads(st.stdout)["workers"]] == ["prefill-0"]

    _restart_sshd(nodes, 1)
    again = cli("down", "ssh-3node", env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert processes_with(marker) == []
    assert cdir.load() is None


def test_up_force_refuses_unreachable_nodes_before_starting_anything(sshd, tmp_path):
    env, kh = fresh_env(tmp_path)
    topo = topology(tmp_path, sshd, **{"node-c": {"ssh": {"port": 35098, "jump": None}}})
    up = cli("up", str(topo), "--accept-new-host-keys", "--force", "--no-canary", env=env)
    out = up.stdout + up.stderr
    assert up.returncode == 1 and "Traceback" not in out, out
    assert "[node-c] unreachable: cannot connect to 127.0.0.4:35098: connection refused" in out
    assert "nothing was started: --force cannot launch on 1 unreachable node(s) (node-c)" in out
    assert "launching anyway" not in out and "logs in" not in out, out
    assert ClusterDir("ssh-3node", tmp_path / "state").load() is None
    assert not (tmp_path / "state" / "clusters" / "ssh-3node" / "logs").exists() or not any(
        (tmp_path / "state" / "clusters" / "ssh-3node" / "logs").iterdir())
