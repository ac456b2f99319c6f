"""The ssh launcher against real sshd daemons on 127.0.0.2..4 (no torch: trivial processes).

Covers the launcher's prepare / start / poll / stop / tail on several nodes, including the
failure cases that must name the node and leave nothing running (connections and the fan-out
map: test_ssh_connection.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

from conftest_ssh import (hermetic_ssh, node_access, processes_with, ssh_options,  # noqa: F401
                          sshd, sshd_port, target, wait_dead)
from ssh_records import launcher, sleeper, spec, started

import epdctl
from epdctl.launchers import get_launcher
from epdctl.launchers.ssh import SSHLauncher
from epdctl.launchers.ssh.nodes import with_overrides


def _until(pred, limit: float = 30.0) -> bool:  # type: ignore[no-untyped-def]
    """``start`` answers once each supervisor runs; its worker follows a moment later."""
    deadline = time.monotonic() + limit
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# ---- launcher: preparing nodes -------------------------------------------------------------

def test_registry_knows_ssh(hermetic_ssh):
    lau = get_launcher("ssh", accept_new_host_keys=True)  # the one constructor signature
    assert isinstance(lau, SSHLauncher) and lau.options.accept_new_host_keys
    assert lau.options.known_hosts[0] == str(hermetic_ssh.known_hosts)
    assert lau.options.ssh_config is None


def test_prepare_checks_versions_on_all_nodes(sshd, ssh_options, tmp_path):
    with launcher(sshd, ssh_options, tmp_path) as lau:
        res = lau.prepare()
    assert sorted(res.ok) == ["node0", "node1", "node2"]
    assert {i["version"] for i in res.ok.values()} == {epdctl.__version__}
    assert all(Path(i["dir"]).is_dir() for i in res.ok.values())


def test_version_mismatch_and_broken_install_name_node_and_versions(sshd, ssh_options, tmp_path):
    old = tmp_path / "old" / "epdctl"
    old.mkdir(parents=True)
    (old / "__init__.py").write_text("__version__ = '0.0.1'\n")
    broken = tmp_path / "broken" / "epdctl"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('half-installed')\n")
    nodes = node_access(sshd)
    nodes["node1"] = replace(nodes["node1"], setup=(f"export PYTHONPATH={old.parent}",))
    nodes["node2"] = replace(nodes["node2"], setup=(f"export PYTHONPATH={broken.parent}",))
    with launcher(sshd, ssh_options, tmp_path, nodes=nodes) as lau:
        res = lau.prepare()
    assert list(res.ok) == ["node0"]
    assert str(res.failed["node1"]) == (
        f"[node1] epdctl version mismatch: the node has 0.0.1 ({sys.executable}), this machine "
        f"has {epdctl.__version__}; install epdctl {epdctl.__version__} on the node (or run this "
        f"epdctl's version here)")
    assert str(res.failed["node2"]).startswith(
        f"[node2] epdctl is not importable by {sys.executable} on the node (ImportError: "
        f"half-installed)")


def test_failing_setup_line_and_missing_python(sshd, ssh_options, tmp_path):
    nodes = node_access(sshd)
    nodes["node0"] = replace(nodes["node0"], setup=("cd /no/such/dir",))
    nodes["node1"] = replace(nodes["node1"], python="/no/such/python")
    with launcher(sshd, ssh_options, tmp_path, nodes=nodes) as lau:
        res = lau.prepare()
    assert list(res.ok) == ["node2"]
    assert str(res.failed["node0"]).startswith("[node0] its setup lines failed (exit 1) before "
                                               "epdctl could run there: ")
    assert "/no/such/dir" in str(res.failed["node0"])
    assert str(res.failed["node1"]).startswith("[node1] '/no/such/python' or a setup command was "
                                               "not found on the node (exit 127)")


# ---- launcher: processes -------------------------------------------------------------------

def test_start_poll_kill_behind_back_and_stop(sshd, ssh_options, tmp_path):
    marker = f"epd-h5-{uuid.uuid4().hex}"
    lau = launcher(sshd, ssh_options, tmp_path)
    handles = [spec(f"w{i}", "encoder", n.name, sleeper(marker), tmp_path)
               for i, n in enumerate(sshd.nodes)]
    res = started(lau, handles)
    assert res.all_ok, res.failed
    try:
        assert _until(lambda: len(processes_with(marker)) == 3)  # each supervisor starts its worker
        # The node records what it started, pid and ports included.
        rec = json.loads((tmp_path / "remote" / "t" / "node1" / "w1.json").read_text())
        assert rec["pid"] == res.ok["w1"].pid == rec["pgid"]
        assert os.getsid(rec["pid"]) == rec["pid"]  # own session: detached from ssh
        lau.close()  # every SSH session is gone; the workers must not care

        again = SSHLauncher(tmp_path / "clusters" / "t", options=ssh_options)
        assert all(s.alive for s in again.poll(handles).ok.values())
        os.killpg(res.ok["w2"].pgid, signal.SIGKILL)  # behind epdctl's back
        wait_dead(res.ok["w2"].pid)
        polled = again.poll(handles)
        assert [n for n, s in polled.ok.items() if not s.alive] == ["w2"]
        assert polled.ok["w2"].tail.splitlines()[-1] == "up"
        assert "=== epdctl: starting w2 on" in Path(handles[2].log).read_text()  # local mirror
        assert again.logs(handles[1]).endswith("\nup")
        stopped = again.stop(handles, grace=5)
        assert stopped.all_ok and sorted(stopped.ok) == ["w0", "w1", "w2"]
        assert processes_with(marker) == []
        assert again.records("node0") == []
    finally:
        lau.stop(handles, grace=1)
        lau.close()


def test_one_agent_per_node_serves_every_call_of_a_launcher(sshd, ssh_options, tmp_path):
    """prepare, start, poll, tail and stop on one node: one shell and one ``python -S`` agent
    there (the program is sent once; every request after it is one line)."""
    marker = f"epd-agent-{uuid.uuid4().hex}"
    node = sshd.nodes[0].name
    rec = spec("w0", "encoder", node, sleeper(marker), tmp_path)
    daemon = sshd.nodes[0].pid

    def agents() -> list[int]:  # agents under this node's sshd not left by an earlier test
        return [p.pid for p in processes_with("epdctl-agent")
                if daemon in (q.pid for q in p.parents()) and "-S" in p.cmdline() and p.pid not in earlier]
    earlier: list[int] = []
    earlier = agents()
    with launcher(sshd, ssh_options, tmp_path) as lau:
        res = started(lau, [rec])
        assert res.all_ok, res.failed
        session = lau.sessions[node]
        chan = session._chan
        first = agents()
        assert len(first) == 1, first
        assert lau.poll([rec]).ok["w0"].alive
        assert lau.logs(rec).endswith("up")
        assert lau.stop([rec], grace=5).all_ok
        assert lau.sessions[node] is session and session._chan is chan and not chan.closed
        assert agents() == first
    wait_dead(first[0])  # closing the connection ends the agent (EOF on its stdin)
    assert processes_with(marker) == []


def test_stop_never_signals_a_process_it_cannot_prove_it_started(sshd, ssh_options, tmp_path):
    marker = f"epd-h5-{uuid.uuid4().hex}"
    with launcher(sshd, ssh_options, tmp_path) as lau:
        h = spec("w", "decode", "node0", sleeper(marker), tmp_path)
        assert started(lau, [h]).all_ok
        assert _until(lambda: len(processes_with(marker)) == 1)  # the supervisor started it
        try:
            assert h.handle is not None
            impostor = replace(h, handle=replace(h.handle, create_time=h.handle.create_time - 3600))
            assert lau.poll([impostor]).ok["w"].alive is False  # pid reused, as far as it knows
            assert lau.stop([impostor], grace=1).all_ok
            assert len(processes_with(marker)) == 1
        finally:
            assert lau.stop([h], grace=5).all_ok
        assert processes_with(marker) == []


def test_start_failures_name_node_and_worker_with_log_tail(sshd, ssh_options, tmp_path):
    with launcher(sshd, ssh_options, tmp_path) as lau:
        res = started(lau, [
            spec("gone", "prefill", "node1",
                 ("sh", "-c", "echo 'error: model path /nope does not exist' >&2; exit 2"), tmp_path),
            spec("nocmd", "decode", "node2", ("/no/such/binary", "--x"), tmp_path),
        ])
    assert res.ok == {}
    assert str(res.failed["gone"]).startswith("[node1/gone] exited with status 2 right after "
                                              "start; last lines of ")
    assert str(res.failed["gone"]).endswith("\nerror: model path /nope does not exist")
    assert str(res.failed["nocmd"]).startswith("[node2/nocmd] cannot start /no/such/binary: ")


def test_unreachable_node_fails_alone_and_nothing_is_left(sshd, ssh_options, tmp_path):
    marker = f"epd-h5-{uuid.uuid4().hex}"
    nodes = node_access(sshd)
    nodes["node2"] = with_overrides(nodes["node2"], host="127.0.0.97")
    with launcher(sshd, ssh_options, tmp_path, nodes=nodes) as lau:
        lau.starter.prepared = {n: {} for n in nodes}  # nodes prepared earlier: start goes per node
        recs = [spec(f"w{i}", "encoder", f"node{i}", sleeper(marker), tmp_path) for i in range(3)]
        res = started(lau, recs)
        assert sorted(res.ok) == ["w0", "w1"]
        assert str(res.failed["w2"]).startswith("[node2] cannot connect to 127.0.0.97:")
        assert len(processes_with(marker)) == 2
        assert lau.stop(recs[:2], grace=5).all_ok
    assert processes_with(marker) == []


def test_env_is_expanded_here_or_on_the_node_and_values_are_not_stored(
        sshd, ssh_options, tmp_path, monkeypatch):
    monkeypatch.setenv("H5_SECRET", "s3cr3t-value-h5")
    monkeypatch.delenv("H5_NODE_ONLY", raising=False)
    digest = hashlib.sha256(b"s3cr3t-value-h5").hexdigest()  # the secret stays off argv
    check = (f'printf %s "$TOKEN" | sha256sum | grep -q {digest} && test "$WHERE" = from-node '
             f'&& echo env-ok; sleep 900')
    with launcher(sshd, ssh_options, tmp_path, setup=("export H5_NODE_ONLY=from-node",)) as lau:
        recs = [spec("envy", "encoder", "node0", ("sh", "-c", check), tmp_path,
                     env={"TOKEN": "${H5_SECRET}", "WHERE": "${H5_NODE_ONLY}"}),
                spec("lost", "encoder", "node1", ("true",), tmp_path, env={"X": "${H5_NOWHERE}"})]
        res = started(lau, recs)
        try:
            assert str(res.failed["lost"]) == (
                "[node1/lost] cannot start true: environment variable H5_NOWHERE (used by X) "
                "is set neither on the machine running epdctl nor on this node")
            h = recs[0]
            text = ""
            for _ in range(100):
                text = lau.logs(h)
                if "env-ok" in text:
                    break
            assert text.endswith("env-ok")
            stored = [p.read_text() for p in (tmp_path / "remote").rglob("*.json")]
            stored += [p.read_text() for p in (tmp_path / "clusters").rglob("*.json")]
            assert stored and not any("s3cr3t" in s for s in stored)
        finally:
            assert lau.stop(recs[:1], grace=5).all_ok


def last_line(path: Path) -> str:
    lines = path.read_text().splitlines() if path.exists() else []
    return lines[-1] if lines else ""


def test_launcher_protocol_start_prepares_all_nodes_and_uses_local_mirror(
        sshd, ssh_options, tmp_path):
    marker = f"epd-h5-{uuid.uuid4().hex}"
    cdir = tmp_path / "clusters" / "t"
    with launcher(sshd, ssh_options, tmp_path) as lau:
        h = spec("w", "encoder", "node2", sleeper(marker), tmp_path)
        assert started(lau, [h]).all_ok
        try:
            assert sorted(lau.starter.prepared) == ["node0", "node1", "node2"]
            assert h.log == str(cdir / "logs" / "w.log") and h.node == "node2"
            assert lau.poll([h]).ok["w"].alive
            # the worker's first line, read on its node (the interpreter's start on a loaded
            # host); reading it also refreshes the mirror
            assert _until(lambda: lau.logs(h, 5).splitlines()[-1:] == ["up"], 60)
            assert last_line(Path(h.log)) == "up"
        finally:
            assert lau.stop([h]).all_ok
        assert not lau.poll([h]).ok["w"].alive
        assert last_line(Path(h.log)) == "up"
    assert processes_with(marker) == []


def test_follow_streams_new_lines_of_the_remote_log(sshd, ssh_options, tmp_path):
    marker = f"epd-h5-{uuid.uuid4().hex}"
    script = "echo one; sleep 1; echo two; sleep 1; echo three; sleep 900"
    with launcher(sshd, ssh_options, tmp_path) as lau:
        h = spec("chatty", "decode", "node1", ("sh", "-c", script, marker), tmp_path)
        assert started(lau, [h]).all_ok
        try:
            seen = []
            for line in lau.follow(h, lines=10, idle_timeout=60):
                seen.append(line)
                if line == "three":
                    break
            assert seen[0].startswith("=== epdctl: starting chatty on")
            assert seen[1:] == ["one", "two", "three"]
        finally:
            assert lau.stop([h], grace=5).all_ok
    assert processes_with(marker) == []
