"""`epdctl check --links`: the link matrix from the plan, measured for real.

Loopback nodes (127.0.0.x, local runner) go through the real CLI; network-namespace nodes
(10.77.0.x behind a bridge, one link shaped to 100 Mbit/s, one link down) go through the same
library call with a runner that enters each namespace with ``ip netns exec``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from epdctl.commands.check import render_table
from epdctl.preflight.links import (Endpoint, LinkPair, Placement, engine_args, evaluate,
                                    link_pairs, node_pairs, rounds)
from epdctl.preflight.run import run_check
from epdctl.render import build_plan
from epdctl.topology import load_topology
from netns_nodes import NetnsNodes

MODEL = str(Path(__file__).resolve().parents[1] / "models" / "tiny-qwen2vl")
# Declared line rate of the test NICs: low enough that a loaded 2-core machine still passes
# (loopback and veth move 3-7 Gbit/s idle), high enough that a 100 Mbit/s tbf link fails.
HEALTHY_GBPS = 0.25


def ep(node: str, nic: str = "eth0", speed: float | None = 10.0) -> Endpoint:
    return Endpoint(node, nic, "eth", f"10.0.0.{node[-1]}", speed)


def test_pairs_follow_the_roles_and_node_ranks():
    placements = [Placement("encoder-0", "encoder", "e1"), Placement("encoder-1", "encoder", "p1"),
                  Placement("prefill-0", "prefill", "p1"), Placement("prefill-0", "prefill", "p2", 1),
                  Placement("decode-0", "decode", "d1")]
    pairs = node_pairs(placements)
    assert pairs == {("e1", "p1"): ("embeddings",), ("e1", "p2"): ("embeddings",),
                     ("p1", "p2"): ("embeddings", "pp"), ("p1", "d1"): ("kv",),
                     ("p2", "d1"): ("kv",)}
    assert ("p1", "p1") not in pairs          # same node: nothing crosses a NIC


def test_rails_pair_nics_by_index():
    eps = {"a": [ep("a", "mlx5_0"), ep("a", "mlx5_1")], "b": [ep("b", "mlx5_0"), ep("b", "mlx5_1")]}
    out = link_pairs([Placement("p", "prefill", "a"), Placement("d", "decode", "b")], eps)
    assert [(p.src.nic, p.dst.nic, p.rail) for p in out] == [("mlx5_0", "mlx5_0", 0),
                                                            ("mlx5_1", "mlx5_1", 1)]


def test_rounds_never_share_a_node_and_keep_every_pair():
    pairs = [LinkPair(ep(a), ep(b), ("kv",)) for a, b in
             [("n1", "n2"), ("n1", "n3"), ("n2", "n4"), ("n3", "n4"), ("n5", "n6")]]
    sched = rounds(pairs)
    assert sorted(p.label for r in sched for p in r) == sorted(p.label for p in pairs)
    for r in sched:
        nodes = [n for p in r for n in (p.src.node, p.dst.node)]
        assert len(nodes) == len(set(nodes))
    assert [p.label for p in sched[0]] == ["n1->n2", "n3->n4", "n5->n6"]


def test_evaluate_against_the_slower_nic():
    pair = LinkPair(ep("n1", speed=100.0), ep("n2", speed=25.0), ("kv",))
    good = evaluate(pair, {"ok": True, "gbps": 21.0, "rtt_ms": 0.1}, 0.8)
    assert good.ok and good.line_gbps == 25.0
    slow = evaluate(pair, {"ok": True, "gbps": 10.0, "rtt_ms": 0.1}, 0.8)
    assert not slow.ok and slow.reason.startswith("slow: 10 Gb/s is 40% of the 25 Gb/s")
    down = evaluate(pair, {"ok": False, "reason": "unreachable: no answer"}, 0.8)
    assert not down.ok and down.reason == "unreachable: no answer"
    undeclared = LinkPair(ep("n1", speed=None), ep("n2", speed=None), ("kv",))
    assert evaluate(undeclared, {"ok": True, "gbps": 0.001}, 0.8).ok


def test_mooncake_measures_rdma_on_rdma_nics_and_tcp_elsewhere():
    roce = Endpoint("a", "mlx5_0", "roce", "10.0.0.1", 200)
    assert engine_args(roce, "mooncake") == ["--protocol", "rdma", "--device", "mlx5_0"]
    assert engine_args(roce, "zmq") == []
    assert engine_args(ep("a"), "mooncake") == []


LOOPBACK = """\
name: loop3
engine: embedded
launcher: local
model: {{path: {model}}}
defaults: {{host: 0.0.0.0}}
nodes:
  - {{name: n1, host: loop1, nics: [{{name: lo, kind: eth, ip: 127.0.0.1, speed_gbps: {speed}}}]}}
  - {{name: n2, host: loop2, nics: [{{name: lo, kind: eth, ip: 127.0.0.2, speed_gbps: {speed}}}]}}
  - {{name: n3, host: loop3, nics: [{{name: lo, kind: eth, ip: 127.0.0.3, speed_gbps: {speed}}}]}}
roles:
  encoder: {{nodes: [n1], count: 1}}
  prefill: {{nodes: [n2], count: 1}}
  decode: {{nodes: [n3], count: 1}}
ports: {{base: 36100}}
"""


def _cli(topo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epdctl", "check", str(topo), "--links",
                           "--agent-port", "36910", *args],
                          capture_output=True, text=True, timeout=240)


def test_cli_loopback_links_pass_and_report_json(tmp_path):
    topo = tmp_path / "loop.yaml"
    topo.write_text(LOOPBACK.format(model=MODEL, speed=HEALTHY_GBPS))
    res = _cli(topo, "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["ok"] is True
    links = {(lk["src"], lk["dst"]): lk for lk in doc["links"]}
    assert set(links) == {("n1", "n2"), ("n2", "n3")}
    assert links[("n1", "n2")]["kinds"] == ["embeddings"] and links[("n2", "n3")]["kinds"] == ["kv"]
    for lk in links.values():
        assert lk["ok"] and lk["gbps"] >= 0.8 * HEALTHY_GBPS and lk["rtt_ms"] > 0
        assert lk["line_gbps"] == HEALTHY_GBPS
    assert {c["check"] for c in doc["checks"]} >= {"nic lo device", "model path", "ports",
                                                  "version python"}


def test_cli_loopback_link_below_declared_speed_fails_with_a_table(tmp_path):
    topo = tmp_path / "loop.yaml"
    topo.write_text(LOOPBACK.format(model=MODEL, speed=4000))   # no loopback moves 3.2 Tbit/s
    res = _cli(topo, "--threshold", "0.8")
    assert res.returncode == 1, res.stdout + res.stderr
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("n1->n2", "n2->n3"))]
    assert len(lines) == 2
    assert all("FAIL" in ln and "slow:" in ln and "4000 Gb/s line rate of lo/lo" in ln
               for ln in lines)
    assert "2 check(s) failed" in res.stdout
    assert "Traceback" not in res.stderr


def test_cli_loopback_links_over_mooncake_transfer_engine(tmp_path):
    topo = tmp_path / "loop.yaml"
    topo.write_text(LOOPBACK.format(model=MODEL, speed=HEALTHY_GBPS)
                    + "transfer: {backend: mooncake}\n")
    res = _cli(topo, "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    links = json.loads(res.stdout)["links"]
    assert [(lk["src"], lk["dst"], lk["ok"]) for lk in links] == [("n1", "n2", True),
                                                                 ("n2", "n3", True)]
    assert all(lk["gbps"] >= 0.8 * HEALTHY_GBPS for lk in links)


def test_cli_bad_topology_is_a_message_not_a_traceback(tmp_path):
    topo = tmp_path / "bad.yaml"
    topo.write_text("name: x\nengine: embedded\n")
    res = _cli(topo)
    assert res.returncode == 1
    assert "nodes" in res.stderr and "Traceback" not in res.stderr


NETNS = """\
name: ns4
engine: embedded
launcher: local
model: {{path: {model}}}
defaults: {{host: node}}
nodes:
{nodes}
roles:
  encoder: {{nodes: [n1], count: 1}}
  prefill: {{nodes: [n2, n3], count: 2}}
  decode: {{nodes: [n4], count: 1}}
ports: {{base: 36200}}
"""


@pytest.fixture
def netns4():
    with NetnsNodes(4) as nodes:
        yield nodes


def test_netns_links_slow_and_down_are_named(netns4, tmp_path):
    nodes = "\n".join(
        f"  - {{name: n{i}, host: {netns4.ip(i)}, nics: [{{name: eth0, kind: eth, "
        f"ip: {netns4.ip(i)}, speed_gbps: {HEALTHY_GBPS}}}]}}" for i in range(1, 5))
    path = tmp_path / "ns.yaml"
    path.write_text(NETNS.format(model=MODEL, nodes=nodes))
    topo = load_topology(path)
    netns4.throttle(2)          # n2's egress: 100 Mbit/s -> prefill n2 -> decode n4 is slow
    netns4.link_down(3)         # n3 is cut off: n1 -> n3 and n3 -> n4 are unreachable
    runners = {f"n{i}": netns4.runner(i) for i in range(1, 5)}
    report = run_check(topo, runners, plan=build_plan(topo), links=True, seconds=0.5,
                       agent_port=36920, connect_timeout=2.0)
    by_pair = {(r.pair.src.node, r.pair.dst.node): r for r in report.links}
    assert set(by_pair) == {("n1", "n2"), ("n1", "n3"), ("n2", "n4"), ("n3", "n4")}
    assert by_pair[("n1", "n2")].ok, by_pair[("n1", "n2")]
    slow = by_pair[("n2", "n4")]
    assert not slow.ok and slow.reason.startswith("slow:") and slow.gbps < 0.11
    assert slow.pair.kinds == ("kv",)
    into_n3 = by_pair[("n1", "n3")]
    assert not into_n3.ok and into_n3.reason.startswith("unreachable: no answer from 10.77.0.3")
    from_n3 = by_pair[("n3", "n4")]
    assert not from_n3.ok
    assert from_n3.reason == "unreachable: eth0 (10.77.0.3) is DOWN on the sending node"
    eth = {(i.node, i.check): i for i in report.items}
    assert not eth[("n3", "nic eth0 device")].ok
    assert "eth0 is DOWN" in eth[("n3", "nic eth0 device")].detail
    assert eth[("n1", "nic eth0 device")].ok and not report.ok
    assert eth[("n2", "ports")].ok and eth[("n2", "ports")].detail == "3 free"
    table = render_table(report, "zmq", 0.8)
    assert "n2->n4" in table and "FAIL" in table


def test_ssh_nodes_run_the_agent_over_real_sshd(tmp_path):
    """launcher: ssh: facts and link agents go through epdctl.launchers.ssh.conn to real sshd daemons on
    127.0.0.2..4 (the topology's loopback hosts are swapped in after validation, which rejects
    loopback hosts for multi-node ssh topologies)."""
    from dataclasses import replace

    from sshd_nodes import SshdNodes

    from epdctl.preflight.targets import runners_for
    from epdctl.launchers.ssh import SSHLauncher
    from epdctl.launchers.ssh.conn import SSHOptions
    from epdctl.topology.model import SSH

    path = tmp_path / "ssh.yaml"
    path.write_text(LOOPBACK.format(model=MODEL, speed=HEALTHY_GBPS).replace("launcher: local",
                                                                  "launcher: ssh"))
    topo = load_topology(path)
    with SshdNodes(tmp_path / "sshd", 3, port=36022) as sshd:
        nodes = tuple(replace(n, host=s.host, nics=(replace(n.nics[0], ip=s.host),),
                              ssh=SSH(user=sshd.user, port=s.port, key=str(sshd.client_key)))
                      for n, s in zip(topo.nodes, sshd.nodes))
        topo = replace(topo, nodes=nodes, python=sys.executable)
        opts = SSHOptions(known_hosts=(str(sshd.known_hosts),), ssh_config=None,
                          connect_timeout=10)
        with SSHLauncher(None, topo, options=opts) as lau:
            report = run_check(topo, runners_for(topo, lau), plan=build_plan(topo), links=True,
                               agent_port=36950)
    assert [i for i in report.items if not i.ok] == []
    assert {(i.node, i.check) for i in report.items} >= {("n1", "nic lo device"),
                                                         ("n3", "ports")}
    pairs = {(r.pair.src.ip, r.pair.dst.ip): r for r in report.links}
    assert set(pairs) == {("127.0.0.2", "127.0.0.3"), ("127.0.0.3", "127.0.0.4")}
    assert all(r.ok for r in pairs.values()), [r.reason for r in report.links]


def test_agent_refuses_a_source_address_the_node_does_not_have():
    """A NIC IP that is not on the sending node is reported as a wrong NIC before any traffic."""
    res = subprocess.run([sys.executable, "-m", "epdctl.node.preflight_agent", "send",
                          "--to", "127.0.0.3:36999", "--src", "10.77.250.250"],
                         capture_output=True, text=True, timeout=60)
    doc = json.loads(res.stdout)
    assert doc["ok"] is False
    assert doc["reason"] == "wrong NIC: 10.77.250.250 is not an address of this node"


def test_an_unreachable_ssh_node_is_a_finding_not_a_crash():
    from epdctl.preflight.run import collect_facts
    from epdctl.preflight.runners import SSHRunner
    from epdctl.launchers.ssh.conn import SSHConnection, SSHOptions, SSHTarget

    opts = SSHOptions(known_hosts=(), ssh_config=None, connect_timeout=3)
    conn = SSHConnection(SSHTarget(node="gone", host="127.0.0.9", port=36023, user="root"), opts)
    item = collect_facts(SSHRunner("gone", conn), None)
    assert item.node == "gone" and item.check == "reach node" and not item.ok
    assert "127.0.0.9" in item.detail
    pair = LinkPair(Endpoint("gone", "lo", "eth", "127.0.0.9"), Endpoint("b", "lo", "eth", "127.0.0.8"),
                    ("kv",))
    from epdctl.preflight import links

    server = links._Server(pair.dst, 36999, None, None)
    res = links._send(pair, SSHRunner("gone", conn), {("b", "lo", "127.0.0.8"): server}, "zmq",
                      0.1, 0.8, 1.0)
    assert not res.ok and res.reason.startswith("agent could not run on gone:")
