"""The ssh launcher against real sshd daemons on 127.0.0.2..4 (no torch: trivial processes).

Covers connections (keys, known_hosts policy, ssh config, jump hosts), the fan-out map, and
the launcher's start / poll / stop / tail on several nodes, including the failure cases that
must name the node and leave nothing running.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest_ssh import (hermetic_ssh, node_access, processes_with, ssh_options,  # noqa: E402,F401
                          sshd, sshd_port, target, wait_dead)
from sshd_nodes import SshdNodes, keygen, known_hosts_line  # noqa: E402

import epdctl  # noqa: E402
from epdctl.errors import LaunchError  # noqa: E402
from epdctl.launchers.ssh.fanout import fanout, raise_if_failed  # noqa: E402
from epdctl.launchers import get_launcher  # noqa: E402
from epdctl.state import ProcessRecord  # noqa: E402
from epdctl.launchers.ssh import SSHLauncher  # noqa: E402
from epdctl.launchers.ssh.nodes import with_overrides  # noqa: E402
from epdctl.launchers.ssh.conn import SSHConnection, SSHError, SSHOptions, SSHTarget  # noqa: E402


def sleeper(marker: str) -> tuple[str, ...]:
    """A process that runs until stopped; ``marker`` makes it findable with psutil."""
    return (sys.executable, "-c", "import sys, time; print('up', flush=True); time.sleep(900)",
            marker)


def launcher(sshd: SshdNodes, opts: SSHOptions, tmp_path: Path, **kw) -> SSHLauncher:
    nodes = kw.pop("nodes", None) or node_access(sshd, kw.pop("setup", ()))
    return SSHLauncher(tmp_path / "clusters" / "t", nodes=nodes, cluster="t",
                       options=opts, run_root=str(tmp_path / "remote"), **kw)


def spec(name: str, role: str, node: str, argv: tuple[str, ...], tmp_path: Path,
         env: dict[str, str] | None = None) -> ProcessRecord:
    """A record as `up` makes it: its log is the local mirror in the run folder."""
    return ProcessRecord(name, role, node, list(argv), env=env or {},
                         log=str(tmp_path / "clusters" / "t" / "logs" / f"{name}.log"))


def started(lau: SSHLauncher, recs: list[ProcessRecord]):  # type: ignore[no-untyped-def]
    """Start ``recs``; the handles go into the records that started. Returns the Results."""
    res = lau.start(recs)
    for r in recs:
        if r.name in res.ok:
            r.handle = res.ok[r.name]
    return res


# ---- connections ---------------------------------------------------------------------------

def test_run_command_on_every_node(sshd, ssh_options):
    for i, node in enumerate(sshd.nodes):
        with SSHConnection(target(sshd, i), ssh_options) as c:
            res = c.run("read x; echo got-$x; echo err >&2; exit 3", stdin="hello\n")
        assert (res.rc, res.stdout, res.stderr) == (3, "got-hello\n", "err\n")


def test_connection_reports_the_address_it_reached(sshd, ssh_options):
    with SSHConnection(target(sshd, 2), ssh_options) as c:
        assert c.run("echo $SSH_CONNECTION").stdout.split()[2:] == ["127.0.0.4", str(sshd.port)]


def test_unreachable_node_names_node_and_address(sshd, ssh_options):
    t = target(sshd, 0, node="ghost", host="127.0.0.99")
    with pytest.raises(SSHError, match=r"^\[ghost\] cannot connect to 127\.0\.0\.99:\d+: "
                                        r"connection refused"):
        SSHConnection(t, ssh_options).open()


def test_wrong_key_is_an_authentication_error(sshd, ssh_options, tmp_path):
    keygen(tmp_path / "other_key")
    t = target(sshd, 1, key=str(tmp_path / "other_key"))
    with pytest.raises(SSHError, match=r"^\[node1\] authentication failed for .*@127\.0\.0\.3:"
                                        r".*other_key.*authorized_keys"):
        SSHConnection(t, ssh_options).open()


def test_missing_identity_file(sshd, ssh_options, tmp_path):
    t = target(sshd, 0, key=str(tmp_path / "nope"))
    with pytest.raises(SSHError, match=r"^\[node0\] identity file .*nope does not exist"):
        SSHConnection(t, ssh_options).open()


def test_host_key_mismatch_is_refused_even_with_accept_new(sshd, tmp_path):
    wrong = keygen(tmp_path / "impostor")
    kh = tmp_path / "known_hosts"
    kh.write_text(known_hosts_line("127.0.0.2", sshd.port, wrong))
    before = kh.read_text()
    for accept in (False, True):
        opts = SSHOptions(known_hosts=(str(kh),), ssh_config=None, accept_new_host_keys=accept)
        with pytest.raises(SSHError, match=r"^\[node0\] HOST KEY MISMATCH for \[127\.0\.0\.2\]") as e:
            SSHConnection(target(sshd, 0), opts).open()
        # the advice edits the file that holds the entry, not ~/.ssh/known_hosts
        assert f"ssh-keygen -f '{kh}' -R '[127.0.0.2]:{sshd.port}'" in str(e.value)
    assert kh.read_text() == before


def test_status_from_another_shell_uses_the_known_hosts_up_used(sshd, ssh_options, tmp_path,
                                                                monkeypatch):
    """`up` ran with EPDCTL_KNOWN_HOSTS set; a later shell without it still verifies the
    nodes against that file (recorded in ssh-nodes.json) instead of failing on unknown keys."""
    marker = f"epd-h5-{uuid.uuid4().hex}"
    lau = launcher(sshd, ssh_options, tmp_path)
    recs = [spec("w0", "encoder", "node0", sleeper(marker), tmp_path)]
    try:
        assert started(lau, recs).all_ok
        monkeypatch.delenv("EPDCTL_KNOWN_HOSTS", raising=False)
        monkeypatch.setenv("HOME", str(tmp_path / "empty-home"))
        other = SSHLauncher(tmp_path / "clusters" / "t")   # as `status` builds it
        try:
            assert other.options.known_hosts == ssh_options.known_hosts
            assert other.poll(recs).ok["w0"].alive
        finally:
            other.close()
    finally:
        lau.stop(recs, grace=1)
        lau.close()


def test_unknown_host_key_refused_then_accepted_with_flag(sshd, tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    strict = SSHOptions(known_hosts=(str(kh),), ssh_config=None)
    with pytest.raises(SSHError, match=r"^\[node1\] unknown host key for \[127\.0\.0\.3\]:\d+ "
                                        r".*--accept-new-host-keys"):
        SSHConnection(target(sshd, 1), strict).open()
    assert kh.read_text() == ""
    accept = SSHOptions(known_hosts=(str(kh),), ssh_config=None, accept_new_host_keys=True)
    with SSHConnection(target(sshd, 1), accept) as c:
        assert c.run("true").rc == 0
    assert kh.read_text().split() == known_hosts_line("127.0.0.3", sshd.port,
                                                      sshd.nodes[1].host_key_pub).split()
    with SSHConnection(target(sshd, 1), strict) as c:  # now recorded: strict mode connects
        assert c.run("echo ok").stdout == "ok\n"


def test_ssh_config_fills_what_the_topology_leaves_out(sshd, tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host alias-b\n  HostName 127.0.0.3\n  Port {sshd.port}\n"
                   f"Host *\n  User {sshd.user}\n  IdentityFile {sshd.client_key}\n")
    opts = SSHOptions(known_hosts=(str(sshd.known_hosts),), ssh_config=str(cfg))
    with SSHConnection(SSHTarget(node="b", host="alias-b"), opts) as c:
        assert c.run("echo $SSH_CONNECTION").stdout.split()[2:] == ["127.0.0.3", str(sshd.port)]


def test_jump_host_from_ssh_config_and_from_target(sshd, tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host behind\n  HostName 127.0.0.4\n  Port {sshd.port}\n"
                   f"  ProxyJump {sshd.user}@127.0.0.2:{sshd.port}\n"
                   f"Host *\n  IdentityFile {sshd.client_key}\n")
    opts = SSHOptions(known_hosts=(str(sshd.known_hosts),), ssh_config=str(cfg))
    accepted = sshd.nodes[0].log.read_text().count("Accepted publickey")
    with SSHConnection(SSHTarget(node="c", host="behind"), opts) as c:
        assert c.run("echo $SSH_CONNECTION").stdout.split()[2] == "127.0.0.4"
    assert sshd.nodes[0].log.read_text().count("Accepted publickey") == accepted + 1


def test_jump_host_that_forbids_forwarding_names_both_hops(sshd, ssh_options, tmp_path):
    with SshdNodes(tmp_path / "nofwd", 1, port=sshd.port, first=20,
                   extra_config="AllowTcpForwarding no\n") as guard:
        jump = SSHTarget(node="guard", host=guard.nodes[0].host, user=guard.user,
                         port=guard.port, key=str(guard.client_key))
        opts = SSHOptions(known_hosts=(str(sshd.known_hosts), str(guard.known_hosts)),
                          ssh_config=None)
        ok = target(sshd, 2, jump=None)
        with SSHConnection(ok, opts) as c:  # reachable directly ...
            assert c.run("true").rc == 0
        with pytest.raises(SSHError, match=r"^\[node2 via 127\.0\.0\.20\] cannot open a tunnel "
                                            r"from 127\.0\.0\.20 to 127\.0\.0\.4"):
            SSHConnection(target(sshd, 2, jump=jump), opts).open()  # ... but not through it


# ---- fan-out -------------------------------------------------------------------------------

def test_fanout_keeps_every_outcome_in_order():
    def work(key: str, n: int) -> int:
        if n % 3 == 0:
            raise LaunchError(f"[{key}] cannot do {n}")
        return n * n

    items = {f"n{i}": i for i in range(10)}
    par = fanout(items, work)
    ser = fanout(items, work, parallel=False)
    assert list(par.ok) == list(ser.ok) == ["n1", "n2", "n4", "n5", "n7", "n8"]
    assert par.ok == ser.ok == {k: v * v for k, v in items.items() if v % 3}
    assert list(par.failed) == ["n0", "n3", "n6", "n9"]
    with pytest.raises(LaunchError) as e:
        raise_if_failed(par, "squaring")
    assert str(e.value).splitlines() == ["squaring failed on 4 of 10:", "[n0] cannot do 0",
                                         "[n3] cannot do 3", "[n6] cannot do 6", "[n9] cannot do 9",
                                         "fine: n1, n2, n4, n5, n7, n8"]
    assert e.value.results is par


def test_fanout_over_nodes_reports_the_bad_one_and_the_good_ones(sshd, ssh_options):
    targets = {n.name: target(sshd, i) for i, n in enumerate(sshd.nodes)}
    targets["node1"] = target(sshd, 1, host="127.0.0.98")

    def hostname(node: str, t: SSHTarget) -> str:
        with SSHConnection(t, ssh_options) as c:
            return c.run("echo $SSH_CONNECTION").stdout.split()[2]

    res = fanout(targets, hostname)
    assert res.ok == {"node0": "127.0.0.2", "node2": "127.0.0.4"}
    assert str(res.failed["node1"]).startswith("[node1] cannot connect to 127.0.0.98")


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
        assert len(processes_with(marker)) == 3
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


def test_stop_never_signals_a_process_it_cannot_prove_it_started(sshd, ssh_options, tmp_path):
    marker = f"epd-h5-{uuid.uuid4().hex}"
    with launcher(sshd, ssh_options, tmp_path) as lau:
        h = spec("w", "decode", "node0", sleeper(marker), tmp_path)
        assert started(lau, [h]).all_ok
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
        lau._prepared = {n: {} for n in nodes}  # nodes prepared earlier: start goes per node
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


def test_launcher_protocol_start_prepares_all_nodes_and_uses_local_mirror(
        sshd, ssh_options, tmp_path):
    marker = f"epd-h5-{uuid.uuid4().hex}"
    cdir = tmp_path / "clusters" / "t"
    with launcher(sshd, ssh_options, tmp_path) as lau:
        h = spec("w", "encoder", "node2", sleeper(marker), tmp_path)
        assert started(lau, [h]).all_ok
        try:
            assert sorted(lau._prepared) == ["node0", "node1", "node2"]
            assert h.log == str(cdir / "logs" / "w.log") and h.node == "node2"
            assert lau.poll([h]).ok["w"].alive
        finally:
            assert lau.stop([h]).all_ok
        assert not lau.poll([h]).ok["w"].alive
        assert Path(h.log).read_text().splitlines()[-1] == "up"
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
