"""SSH connections against real sshd daemons on 127.0.0.2..4: keys, the known_hosts policy,
ssh config, jump hosts, and the fan-out map over nodes; every failure names the node."""

from __future__ import annotations

import uuid

import pytest

from conftest_ssh import (hermetic_ssh, node_access, processes_with, ssh_options,  # noqa: F401
                          sshd, sshd_port, target, wait_dead)
from sshd_nodes import SshdNodes, keygen, known_hosts_line
from ssh_records import launcher, sleeper, spec, started

from epdctl.errors import LaunchError
from epdctl.launchers.ssh import SSHLauncher
from epdctl.launchers.ssh.conn import SSHConnection, SSHError, SSHOptions, SSHTarget
from epdctl.launchers.ssh.fanout import fanout, raise_if_failed


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
