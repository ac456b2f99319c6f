"""Node checks: every RDMA/GPU failure mode, judged from recorded tool outputs."""

from __future__ import annotations

import json
from pathlib import Path

from epdctl.preflight.node_checks import (Facts, NicExpect, NodeExpect, check_node,
                                          check_versions, dmabuf_capable)

FIX = Path(__file__).parent / "fixtures" / "preflight"

# The netdev of the RoCE NIC in ibv_devinfo_v_roce_gids.txt carries 10.110.0.33 (its GID[3]).
IP_ADDR = json.dumps([
    {"ifname": "lo", "operstate": "UNKNOWN", "mtu": 65536,
     "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
    {"ifname": "eth05", "operstate": "UP", "mtu": 4200,
     "addr_info": [{"family": "inet", "local": "10.110.0.33", "prefixlen": 24}]},
])
HEALTHY = {"ibv_devinfo": "ibv_devinfo_v_roce_gids.txt", "lsmod": "lsmod_peermem.txt",
           "ulimit_l": "ulimit_l_unlimited.txt", "nvidia_smi": "nvidia_smi_query_8xh100.csv",
           "df": "df_this_machine.txt", "ss": "ss_ltn_this_machine.txt"}
ROCE = NicExpect("mlx5_0", "roce", "10.110.0.33", 200)
EXPECT = NodeExpect("gpu1", nics=(ROCE,), gpus=8, model_path="/models/qwen",
                    ports=(("0.0.0.0", 30000),), rdma_transport=True)


def facts(**swap: str | None) -> Facts:
    """Healthy node facts with some probes replaced by another fixture (or failed: None)."""
    names = {**HEALTHY, **swap}
    probes = {k: ({"rc": 0, "out": (FIX / v).read_text()} if v else
                  {"rc": 127, "out": "", "err": f"{k}: command not found"})
              for k, v in names.items()}
    probes["ip_addr"] = {"rc": 0, "out": IP_ADDR}
    return Facts("gpu1", probes, {"python": "3.11.2"}, {"/models/qwen": True})


def failing(items) -> dict[str, str]:
    return {i.check: i.detail for i in items if not i.ok}


def test_healthy_roce_node_passes_everything():
    items = check_node(EXPECT, facts())
    assert failing(items) == {}
    checks = {i.check for i in items}
    assert {"nic mlx5_0 device", "nic mlx5_0 state", "nic mlx5_0 link layer", "nic mlx5_0 rate",
            "nic mlx5_0 mtu", "nic mlx5_0 gid", "ulimit -l", "gpudirect", "gpus", "model path",
            "disk", "ports"} <= checks
    gid = next(i for i in items if i.check == "nic mlx5_0 gid")
    assert "index 3" in gid.detail


def test_device_missing_names_the_devices_present():
    items = check_node(NodeExpect("gpu1", nics=(NicExpect("mlx5_4", "roce", None, 200),)), facts())
    assert "mlx5_4 not found" in failing(items)["nic mlx5_4 device"]
    assert "mlx5_0" in failing(items)["nic mlx5_4 device"]


def test_no_rdma_stack_at_all_is_reported_with_the_tool_error():
    f = facts(ibv_devinfo=None)
    f.probes["ibv_devinfo"] = {"rc": 255, "out": "",
                               "err": (FIX / "ibv_devinfo_this_machine.txt").read_text()}
    detail = failing(check_node(EXPECT, f))["nic mlx5_0 device"]
    assert "Function not implemented" in detail


def test_port_not_active_down_init_polling():
    for fixture, state in (("ibv_devinfo_v_port_init.txt", "INIT"),
                           ("ibv_devinfo_v_port_polling.txt", "DOWN")):
        detail = failing(check_node(EXPECT, facts(ibv_devinfo=fixture)))["nic mlx5_0 state"]
        assert state in detail
    polling = failing(check_node(EXPECT, facts(ibv_devinfo="ibv_devinfo_v_port_polling.txt")))
    assert "POLLING" in polling["nic mlx5_0 state"]
    down = check_node(NodeExpect("n", nics=(NicExpect("mlx5_10", "roce"),)),
                      facts(ibv_devinfo=None, ibstat="ibstat_roce_200g.txt"))
    assert "DOWN, physical DISABLED" in failing(down)["nic mlx5_10 state"]


def test_link_layer_mismatch_both_ways():
    ib_port = failing(check_node(EXPECT, facts(ibv_devinfo="ibv_devinfo_v_link_layer_ib.txt")))
    assert "InfiniBand, but the topology declares kind roce" in ib_port["nic mlx5_0 link layer"]
    want_ib = NodeExpect("n", nics=(NicExpect("mlx5_0", "ib", None, 200),))
    eth_port = failing(check_node(want_ib, facts(ibv_devinfo=None, ibstat="ibstat_roce_200g.txt")))
    assert "Ethernet, but the topology declares kind ib" in eth_port["nic mlx5_0 link layer"]


def test_rate_below_declared_speed():
    slow = failing(check_node(EXPECT, facts(ibv_devinfo="ibv_devinfo_v_rate_100g.txt")))
    assert "100 Gb/s, below the declared 200 Gb/s" in slow["nic mlx5_0 rate"]
    via_ibstat = NodeExpect("n", nics=(NicExpect("mlx5_1", "roce", None, 200),))
    res = failing(check_node(via_ibstat, facts(ibv_devinfo=None, ibstat="ibstat_roce_100g.txt")))
    assert "below the declared 200" in res["nic mlx5_1 rate"]


def test_ulimit_l_64_fails_with_the_fix():
    detail = failing(check_node(EXPECT, facts(ulimit_l="ulimit_l_64.txt")))["ulimit -l"]
    assert detail.startswith("64 KiB") and "memlock unlimited" in detail


def test_gpudirect_missing_without_peermem_or_dmabuf():
    detail = failing(check_node(EXPECT, facts(lsmod="lsmod_no_peermem.txt")))["gpudirect"]
    assert "nvidia_peermem" in detail
    f = facts(lsmod="lsmod_no_peermem.txt")
    f.probes["uname_r"] = {"rc": 0, "out": "6.8.0-90-generic"}
    f.probes["nvidia_driver"] = {
        "rc": 0, "out": "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  590.44.01"}
    assert "gpudirect" not in failing(check_node(EXPECT, f))
    assert not dmabuf_capable("5.4.0-42-generic", "NVIDIA UNIX Open Kernel Module 550")
    assert not dmabuf_capable("6.8.0", "NVIDIA UNIX x86_64 Kernel Module 535.161.08")


def test_zero_gid_and_small_mtu():
    gid = failing(check_node(EXPECT, facts(ibv_devinfo="ibv_devinfo_v_zero_gid.txt")))
    assert "all-zero" in gid["nic mlx5_0 gid"]
    mtu = failing(check_node(EXPECT, facts(ibv_devinfo="ibv_devinfo_v_mtu_256.txt")))
    assert "active MTU 256" in mtu["nic mlx5_0 mtu"]
    wrong_ip = NodeExpect("n", nics=(NicExpect("mlx5_0", "roce", "10.110.0.99"),))
    assert "no RoCE v2 GID maps 10.110.0.99" in failing(check_node(wrong_ip, facts()))["nic mlx5_0 gid"]


def test_fewer_gpus_than_the_plan_needs():
    detail = failing(check_node(EXPECT, facts(nvidia_smi="nvidia_smi_query_6_of_8.csv")))["gpus"]
    assert detail.startswith("6 GPU(s)") and "needs 8" in detail
    listed = failing(check_node(EXPECT, facts(nvidia_smi=None,
                                              nvidia_smi_L="nvidia_smi_L_2xh100.txt")))["gpus"]
    assert listed.startswith("2 GPU(s) NVIDIA H100 80GB HBM3")
    no_smi = failing(check_node(EXPECT, facts(nvidia_smi=None)))["gpus"]
    assert "nvidia-smi failed" in no_smi


def test_model_path_ports_and_disk():
    f = facts()
    f.path_exists = {"/models/qwen": False}
    busy = NodeExpect("gpu1", model_path="/models/qwen", ports=(("127.0.0.1", 2024),),
                      min_disk_gb=10_000)
    bad = failing(check_node(busy, f))
    assert "does not exist" in bad["model path"]
    assert "127.0.0.1:2024" in bad["ports"]
    assert "below 10000 GiB" in bad["disk"]


def test_eth_nic_down_or_wrong_name():
    f = facts()
    f.probes["ip_addr"] = {"rc": 0, "out": IP_ADDR.replace('"UP"', '"DOWN"')}
    down = failing(check_node(NodeExpect("n", nics=(NicExpect("eth05", "eth", "10.110.0.33"),)), f))
    assert "eth05 is DOWN" in down["nic eth05 device"]
    wrong = failing(check_node(NodeExpect("n", nics=(NicExpect("eth1", "eth", "10.110.0.33"),)), facts()))
    assert "10.110.0.33 is on eth05" in wrong["nic eth1 device"]


def test_versions_must_match_on_every_node():
    a = Facts("a", {}, {"python": "3.11.2", "epdctl": "0.1.0"})
    b = Facts("b", {}, {"python": "3.12.1", "epdctl": "0.1.0"})
    items = {i.check: i for i in check_versions([a, b])}
    assert items["version epdctl"].ok
    assert not items["version python"].ok
    assert "3.11.2 on a" in items["version python"].detail and "3.12.1 on b" in items["version python"].detail
    needed = {i.check: i for i in check_versions([a, b], ("epdctl", "mooncake"))}
    assert needed["version epdctl"].ok and set(needed) == {"version epdctl", "version mooncake"}
    assert "not installed on any node" in needed["version mooncake"].detail


def test_multi_port_hca_is_judged_on_the_port_the_topology_uses():
    """Two ConnectX-3 HCAs, port 1 ACTIVE and port 2 DOWN (a real ibv_devinfo): port 1 passes with the
    unused port named; a topology that uses port 2 fails (diagnose, without a topology, warns)."""
    f = facts(ibv_devinfo="real/ibv_devinfo_mlx4_two_ports_heioy.txt")
    p1 = check_node(NodeExpect("n", nics=(NicExpect("mlx4_0", "ib"),)), f)
    assert "nic mlx4_0 state" not in failing(p1)
    other = next(i for i in p1 if i.check == "nic mlx4_0 other ports")
    assert other.status == "warn" and "2 (DOWN)" in other.detail
    p2 = check_node(NodeExpect("n", nics=(NicExpect("mlx4_0", "ib", port=2),)), f)
    assert "port 2 DOWN" in failing(p2)["nic mlx4_0 state"]
    p3 = check_node(NodeExpect("n", nics=(NicExpect("mlx4_0", "ib", port=3),)), f)
    assert "has no port 3 (ports: 1, 2)" in failing(p3)["nic mlx4_0 device"]


def test_sriov_function_the_topology_uses_down_is_an_error():
    """A VF the container cannot open (real ibv_devinfo: 'Failed to open device') whose netdev is Down
    (real ibdev2netdev of an SR-IOV node): an error when the topology uses that function."""
    f = facts(ibv_devinfo="real/ibv_devinfo_failed_open_vfs_k8s.txt", ibdev2netdev="real/ibdev2netdev_sriov_vfs.txt")
    vf = check_node(NodeExpect("n", nics=(NicExpect("mlx5_20", "ib"),)), f)
    assert "ibp141s0v0 (a VF) is Down: the topology uses this function" in failing(vf)["nic mlx5_20 device"]
    pf = check_node(NodeExpect("n", nics=(NicExpect("mlx4_2", "ib"),)), f)
    assert "nic mlx4_2 state" not in failing(pf)
