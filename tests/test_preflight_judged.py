"""`check`'s node judgements on real outputs: content over exit status, advice specific to the
port state, warn level, GID index from the GID table, GPU health, sysfs renderings."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from epdctl.node import sysfs_rdma
from epdctl.preflight.diagnose import judge_text
from epdctl.preflight.node_checks import Facts, NicExpect, NodeExpect, check_node
from epdctl.preflight.textprep import prepare

FIX = Path(__file__).parent / "fixtures" / "preflight"
REAL = FIX / "real"


def body(name: str) -> str:
    return prepare((REAL / name).read_text()).text


def node(**probes: dict) -> Facts:
    base = {"ulimit_l": {"rc": 0, "out": "unlimited\n"},
            "ip_addr": {"rc": 0, "out": '[{"ifname": "lo", "operstate": "UNKNOWN", "addr_info": '
                                         '[{"local": "127.0.0.1", "prefixlen": 8}]}]'}}
    return Facts("gpu1", {**base, **probes}, {}, {})


def by_check(items) -> dict:
    return {i.check: i for i in items}


def test_ibv_devinfo_exit_1_with_the_declared_nic_healthy_passes():
    f = node(ibv_devinfo={"rc": 1, "out": body("ibv_devinfo_failed_open_vfs_k8s.txt"), "err": ""})
    items = by_check(check_node(NodeExpect("n", nics=(NicExpect("mlx4_2", "ib"),)), f))
    assert items["nic mlx4_2 device"].ok and items["nic mlx4_2 state"].ok


def test_error_text_with_exit_0_is_reported_not_crashed():
    f = node(ibv_devinfo={"rc": 0, "out": body("ibv_devinfo_no_devices_pib.txt")})
    items = by_check(check_node(NodeExpect("n", nics=(NicExpect("mlx5_0", "roce"),)), f))
    assert "No IB devices found" in items["nic mlx5_0 device"].detail


def test_init_port_gets_subnet_manager_advice_and_zero_guid_warns():
    f = node(ibv_devinfo={"rc": 0, "out": body("ibv_devinfo_vf_init_zero_guid.txt")})
    items = by_check(check_node(NodeExpect("n", nics=(NicExpect("mlx5_7", "ib"),)), f))
    assert not items["nic mlx5_7 state"].ok
    assert "subnet manager" in items["nic mlx5_7 state"].detail
    assert "cable" not in items["nic mlx5_7 state"].detail.split(";")[1]
    assert items["nic mlx5_7 guid"].status == "warn" and items["nic mlx5_7 guid"].ok


def test_polling_and_disabled_get_different_advice():
    f = node(ibstat={"rc": 0, "out": body("gpud_ibstat_h100_some_down_polling.txt")})
    items = by_check(check_node(NodeExpect("n", nics=(NicExpect("mlx5_11", "roce"),
                                                      NicExpect("mlx5_5", "roce"))), f))
    assert "cable" in items["nic mlx5_11 state"].detail
    assert "enable it" in items["nic mlx5_5 state"].detail


def test_mixed_rail_rates_warn():
    f = node(ibstat={"rc": 0, "out": body("gpud_ibstat_h100_some_down_eth.txt")})
    items = by_check(check_node(NodeExpect("n", nics=(NicExpect("mlx5_0", "roce"),
                                                      NicExpect("mlx5_1", "roce"))), f))
    assert items["rails rate"].status == "warn" and "400" in items["rails rate"].detail


def test_gid_table_probe_gives_the_index_and_the_env_var():
    f = node(ibdev2netdev={"rc": 0, "out": "mlx5_0 port 1 ==> net1 (Up)\n"},
             ibstatus={"rc": 0, "out": "Infiniband device 'mlx5_0' port 1 status:\n"
                                       "\tstate:\t\t 4: ACTIVE\n\tphys state:\t 5: LinkUp\n"
                                       "\trate:\t\t 100 Gb/sec (4X EDR)\n\tlink_layer:\t Ethernet\n"},
             gid_table={"rc": 0, "out": body("show_gids_macvlan_pod.txt")})
    items = by_check(check_node(NodeExpect("n", nics=(NicExpect("mlx5_0", "roce", "10.152.0.12"),)),
                                f))
    gid = items["nic mlx5_0 gid"]
    assert gid.ok and "index 7" in gid.detail and "MC_GID_INDEX" in gid.detail
    wrong = by_check(check_node(NodeExpect("n", nics=(NicExpect("mlx5_0", "roce", "10.0.0.9"),)),
                                f))["nic mlx5_0 gid"]
    assert not wrong.ok and "no RoCE v2 GID maps 10.0.0.9" in wrong.detail


def test_gpu_health_from_the_health_csv():
    csv = ("index, name, uuid, memory.total [MiB], pstate, ecc.errors.uncorrected.volatile.total,"
           " remapped_rows.pending, remapped_rows.failure\n")
    rows = "".join(f"{i}, NVIDIA H100 80GB HBM3, GPU-{i}, 81559 MiB, P0, {e}, {p}, No\n"
                   for i, e, p in ((0, 0, "No"), (1, 2, "No"), (2, 0, "Yes")))
    f = node(nvidia_smi_health={"rc": 0, "out": csv + rows})
    items = check_node(NodeExpect("n", gpus=3), f)
    health = [i.detail for i in items if i.check == "gpu health"]
    assert any("GPU 1: 2 volatile uncorrectable" in d for d in health)
    assert any("GPU 2: a row remap is pending" in d for d in health)
    lost = node(nvidia_smi={"rc": 255, "out": body("nvidia_smi_device_handle_unknown_error.txt")})
    detail = by_check(check_node(NodeExpect("n", gpus=1), lost))["gpus"].detail
    assert "fallen off the bus" in detail and "0000:0B:00.0" in detail


def test_ibstatus_rendered_from_real_sysfs():
    text = sysfs_rdma.ibstatus_text(FIX / "sysfs" / "gpud-h100")
    j = judge_text(text)
    assert j.tool == "ibstatus" and len(j.facts["ports"]) == 9
    rates = {p["device"]: p["rate_gbps"] for p in j.facts["ports"]}
    assert rates["mlx5_0"] == 400 and rates["mlx5_bond_0"] == 200
    f = node(ibstatus={"rc": 0, "out": text})
    items = by_check(check_node(NodeExpect("n", nics=(NicExpect("mlx5_4", "ib", None, 400),)), f))
    assert items["nic mlx5_4 state"].ok and items["nic mlx5_4 rate"].ok


def test_gid_table_and_ibdev2netdev_rendered_from_sysfs(tmp_path):
    """A sysfs tree built from the GID rows of a real show_gids (nccl#1573)."""
    port = tmp_path / "mlx5_0" / "ports" / "1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / sub).mkdir(parents=True)
    for idx in range(8):
        (port / "gids" / str(idx)).write_text("0000:0000:0000:0000:0000:0000:0000:0000\n")
    rows = [r for r in body("show_gids_macvlan_pod.txt").splitlines() if r.startswith("mlx5_0\t")]
    for r in rows:
        _, _, idx, gid, *_rest = r.split("\t")
        ver = r.split("\t")[-2]
        (port / "gids" / idx).write_text(gid + "\n")
        (port / "gid_attrs" / "types" / idx).write_text("RoCE v2\n" if ver == "v2" else "IB/RoCE v1\n")
        (port / "gid_attrs" / "ndevs" / idx).write_text("net1\n")
    net = tmp_path / "mlx5_0" / "device" / "net" / "net1"
    net.mkdir(parents=True)
    (net / "operstate").write_text("up\n")
    j = judge_text(sysfs_rdma.gid_table_text(tmp_path))
    assert j.tool == "show_gids" and j.facts["recommended_gid_index"] == {"mlx5_0": 7}
    assert sysfs_rdma.ibdev2netdev_text(tmp_path) == "mlx5_0 port 1 ==> net1 (Up)\n"


# --- `check` over every collected real output that a node probe yields -------------------------


INDEX = yaml.safe_load((REAL / "INDEX.yaml").read_text())["files"]
PROBE = {"ibv_devinfo": "ibv_devinfo", "ibstat": "ibstat", "ibstatus": "ibstatus",
         "ibdev2netdev": "ibdev2netdev", "show_gids": "gid_table", "nvidia-smi": "nvidia_smi",
         "nvidia-smi --query-gpu": "nvidia_smi", "nvidia-smi -L": "nvidia_smi_L",
         "nvidia-smi -q": "nvidia_smi", "lsmod": "lsmod", "ulimit -l": "ulimit_l"}
CHECKED = [e for e in INDEX if e["tool"] in PROBE]


def _expect_for(entry: dict, j) -> NodeExpect:
    """Declare what the output shows (every device, every GPU) so the check judges all of it."""
    tool = entry["tool"]
    if tool in ("ibv_devinfo", "ibstat", "ibstatus", "ibdev2netdev", "show_gids"):
        rows = j.facts.get("ports") or j.facts.get("links") or j.facts.get("gids") or []
        devs = sorted({r["device"] for r in rows if r["device"] != "?"}) or ["mlx5_0"]
        layer = {r["device"]: r.get("link_layer", "") for r in rows}
        return NodeExpect("n", nics=tuple(NicExpect(d, "ib" if layer.get(d) == "InfiniBand"
                                                    else "roce") for d in devs))
    if tool.startswith("nvidia-smi"):
        return NodeExpect("n", gpus=max(1, len(j.facts.get("gpus", []))))
    return NodeExpect("n", nics=(NicExpect("mlx5_0", "roce"),), gpus=1)


@pytest.mark.parametrize("name", [e["file"] for e in CHECKED])
def test_check_agrees_with_diagnose_on_every_real_output(name):
    entry = next(e for e in CHECKED if e["file"] == name)
    text = body(name)
    j = judge_text((REAL / name).read_text())
    probe = PROBE[entry["tool"]]
    f = node(**{probe: {"rc": 0, "out": text}})
    if probe == "ulimit_l":
        f.probes["ulimit_l"] = {"rc": 0, "out": text}
    items = check_node(_expect_for(entry, j), f)
    assert not [i for i in items if i.check.endswith(" read")], "a reader raised"
    judged = [i for i in items if _about(i.check, entry["tool"])]
    assert judged, [i.check for i in items]
    if entry["verdict"] == "fail":
        assert any(not i.ok for i in judged), [(i.check, i.detail) for i in judged]
    if entry["verdict"] == "pass":
        assert all(i.ok for i in judged), [(i.check, i.detail) for i in judged if not i.ok]


def _about(check: str, tool: str) -> bool:
    if tool.startswith("nvidia-smi"):
        return check in ("gpus", "gpu health")
    if tool == "lsmod":
        return check == "gpudirect"
    if tool == "ulimit -l":
        return check == "ulimit -l"
    if tool == "show_gids":
        return check.endswith((" gid", " device"))
    if tool == "ibdev2netdev":
        return check.endswith((" netdev", " device"))
    return check.startswith("nic ") or check == "rails rate"
