"""Parsers against recorded outputs of real machines (tests/fixtures/preflight/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from epdctl.preflight import parsers

FIX = Path(__file__).parent / "fixtures" / "preflight"


def text(name: str) -> str:
    return (FIX / name).read_text()


def test_ibstat_roce_ports_and_a_disabled_one():
    ports = {p.device: p for p in parsers.parse_ibstat(text("ibstat_roce_200g.txt"))}
    assert sorted(ports) == ["mlx5_0", "mlx5_1", "mlx5_10"]
    assert ports["mlx5_0"].state == "ACTIVE" and ports["mlx5_0"].phys_state == "LINKUP"
    assert ports["mlx5_0"].rate_gbps == 200 and ports["mlx5_0"].link_layer == "Ethernet"
    assert ports["mlx5_10"].state == "DOWN" and ports["mlx5_10"].phys_state == "DISABLED"
    assert ports["mlx5_10"].rate_gbps is None


def test_ibstat_infiniband_with_tabs_and_trailing_error_line():
    (port,) = parsers.parse_ibstat(text("ibstat_ib_200g.txt"))
    assert (port.device, port.port, port.state, port.link_layer, port.rate_gbps) == \
        ("mlx5_7", 1, "ACTIVE", "InfiniBand", 200.0)


def test_ibv_devinfo_two_devices_two_ports_each():
    ports = parsers.parse_ibv_devinfo(text("ibv_devinfo_ib_mlx4.txt"))
    assert [(p.device, p.port, p.state) for p in ports] == [
        ("mlx4_1", 1, "ACTIVE"), ("mlx4_1", 2, "DOWN"), ("mlx4_0", 1, "ACTIVE"), ("mlx4_0", 2, "DOWN")]
    assert all(p.link_layer == "InfiniBand" and p.active_mtu == 4096 for p in ports)


def test_ibv_devinfo_verbose_gids_rate_and_phys_state():
    (p,) = parsers.parse_ibv_devinfo(text("ibv_devinfo_v_roce_gids.txt"))
    assert p.device == "mlx5_0" and p.state == "ACTIVE" and p.phys_state == "LINK_UP"
    assert p.rate_gbps == 200.0                       # 4X x 50.0 Gbps
    assert p.gids[3] == "::ffff:10.110.0.33" and p.gid_types[3] == "RoCE v2"
    assert p.gid_types[0] == "RoCE v1" and len(p.gids) == 4


def test_ibv_devinfo_old_rxe_without_link_layer_and_port_down():
    (rxe,) = parsers.parse_ibv_devinfo(text("ibv_devinfo_rxe_no_link_layer.txt"))
    assert rxe.link_layer == "" and rxe.active_mtu == 1024 and rxe.state == "ACTIVE"
    (down,) = parsers.parse_ibv_devinfo(text("ibv_devinfo_port_down_eth.txt"))
    assert (down.device, down.state, down.link_layer) == ("mlx5_12", "DOWN", "Ethernet")


def test_ibv_devinfo_on_a_machine_without_rdma_has_no_ports():
    assert parsers.parse_ibv_devinfo(text("ibv_devinfo_this_machine.txt")) == []


def test_perftest_result_rows_in_gbits_and_mbytes():
    bw = parsers.parse_ib_write_bw(text("ib_write_bw_gbits.txt"))
    assert (bw.size_bytes, bw.iterations, bw.avg_gbps, bw.device, bw.link_type) == \
        (8, 224958464, 0.48, "ib0", "Ethernet")
    mb = parsers.parse_ib_write_bw(text("ib_send_bw_mbsec.txt"))
    assert mb.avg_gbps == pytest.approx(5544.28 * 8 / 1000)
    with pytest.raises(ValueError, match="no perftest result row"):
        parsers.parse_ib_write_bw(text("ib_write_bw_no_device.txt"))


def test_nvidia_smi_csv_with_units_and_list():
    gpus = parsers.parse_nvidia_smi_csv(text("nvidia_smi_query_8xh100.csv"))
    assert len(gpus) == 8 and gpus[7].index == 7
    assert gpus[0].name == "NVIDIA H100 80GB HBM3" and gpus[0].memory_mib == 81559
    assert len(parsers.parse_nvidia_smi_csv(text("nvidia_smi_query_6_of_8.csv"))) == 6
    listed = parsers.parse_nvidia_smi_list(text("nvidia_smi_L_2xh100.txt"))
    assert [g.index for g in listed] == [0, 1] and listed[1].uuid.startswith("GPU-")
    with pytest.raises(ValueError):
        parsers.parse_nvidia_smi_csv("index, name\nzero, X\n")


def test_lsmod_with_and_without_peermem():
    mods = parsers.parse_lsmod(text("lsmod_peermem.txt"))
    assert "nvidia_peermem" in mods and "nvidia_peermem" in mods["ib_core"].used_by
    assert mods["nvidia"].use_count == 550
    assert "nvidia_peermem" not in parsers.parse_lsmod(text("lsmod_no_peermem.txt"))
    proc = ("nvidia_peermem 16384 0 - Live 0x0000000000000000 (OE)\n"
            "ib_core 434176 9 nvidia_peermem, Live 0x0\n")
    assert parsers.parse_lsmod(proc)["ib_core"].used_by == ("nvidia_peermem",)


def test_ulimit_df_ip_ss_of_this_machine():
    assert parsers.parse_ulimit_l(text("ulimit_l_unlimited.txt")) is None
    assert parsers.parse_ulimit_l(text("ulimit_l_64.txt")) == 64
    assert parsers.parse_ulimit_l(text("ulimit_l_this_machine.txt")) == 8192
    with pytest.raises(ValueError):
        parsers.parse_ulimit_l("bash: ulimit: bad\n")
    (disk,) = parsers.parse_df(text("df_this_machine.txt"))
    assert disk.mount == "/" and disk.avail_kib > 0
    ifaces = {i.name: i for i in parsers.parse_ip_j_addr(text("ip_j_addr_this_machine.json"))}
    assert ifaces["lo"].holds("127.0.0.3") and not ifaces["eth0"].holds("127.0.0.3")
    assert ifaces["eth0"].holds("192.0.2.2") and ifaces["eth0"].state == "UP"
    brief = {i.name: i for i in parsers.parse_ip_br_addr(text("ip_br_addr_this_machine.txt"))}
    assert brief["eth0"].addrs[0] == "192.0.2.2" and brief["lo"].holds("127.0.0.9")
    listening = parsers.parse_ss_ltn(text("ss_ltn_this_machine.txt"))
    assert ("*", 2024) in listening
