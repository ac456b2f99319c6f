"""``ibdev2netdev`` and ``show_gids``: which netdev carries each RDMA port, and which GID index
the transfer engine should use.

The GID table decides RoCE connectivity: both ends must use a RoCE v2 GID of the same family, and
the usual "index 3" is only a convention (macvlan pods, for one, get other indexes). Mooncake
reads ``MC_GID_INDEX`` (falling back to ``NCCL_IB_GID_INDEX``), NCCL reads ``NCCL_IB_GID_INDEX``;
both checked in their sources (Mooncake ``transfer_engine/.../config.cpp``, NCCL ``net_ib``).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from epdctl.preflight.judgement import FAIL, PASS, WARN, Judgement

GID_ENV = "MC_GID_INDEX (Mooncake; it falls back to NCCL_IB_GID_INDEX) / NCCL_IB_GID_INDEX (NCCL)"

_NETDEV = re.compile(r"^(\S+)\s+port\s+(\d+)\s+==>\s+(\S+)\s+\((Up|Down)\)", re.I)
_GID_ROW = re.compile(r"^(\S+)\s+(\d+)\s+(\d+)\s+([0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){7})"
                      r"\s+(?:(\d+\.\d+\.\d+\.\d+)\s+)?(v1|v2)\s*(\S*)")


@dataclass(frozen=True)
class NetdevLink:
    device: str
    port: int
    netdev: str
    up: bool
    marked_vf: bool = False      # the agent's sysfs rendering appends " [VF]"

    @property
    def vf(self) -> bool:
        """Marked, or named by systemd as a VF's netdev ``<pf>v<n>`` (``ibp141s0v3``)."""
        return self.marked_vf or bool(re.search(r"\dv\d+$", self.netdev))


@dataclass(frozen=True)
class GidRow:
    device: str
    port: int
    index: int
    gid: str
    ipv4: str
    version: str       # v1 | v2
    netdev: str


def read_ibdev2netdev(text: str) -> list[NetdevLink]:
    out = []
    for ln in text.splitlines():
        m = _NETDEV.match(ln.strip())
        if m:
            out.append(NetdevLink(m.group(1), int(m.group(2)), m.group(3),
                                  m.group(4).lower() == "up", "[VF]" in ln))
    return out


def read_show_gids(text: str) -> list[GidRow]:
    out = []
    for ln in text.splitlines():
        m = _GID_ROW.match(ln.strip())
        if m:
            out.append(GidRow(m.group(1), int(m.group(2)), int(m.group(3)), m.group(4).lower(),
                              m.group(5) or "", m.group(6), m.group(7)))
    return out


def judge_ibdev2netdev(links: list[NetdevLink]) -> Judgement:
    j = Judgement("ibdev2netdev", {"links": [
        {"device": n.device, "port": n.port, "netdev": n.netdev, "up": n.up, "vf": n.vf}
        for n in links]})
    if not links:
        j.add(FAIL, "no `mlx5_0 port 1 ==> netdev (Up)` line in the text",
              "run `ibdev2netdev` (MLNX_OFED / mlnx-tools) on the node and save all of its output")
        return j
    down = [n for n in links if not n.up]
    down_eth = [n for n in down if not n.netdev.startswith("ib")]
    down_ib = [n for n in down if n.netdev.startswith("ib")]
    if len(down) == len(links):
        j.add(FAIL, f"every netdev is Down ({len(links)})",
              "RoCE needs its netdev up (`ip link set <netdev> up`, cable/switch port); for "
              "InfiniBand check the ports with `ibstat` (the netdev here is IPoIB)")
        return j
    if down_eth:
        names = ", ".join(f"{n.device}->{n.netdev}" for n in down_eth)
        j.add(WARN, f"Ethernet netdev(s) Down: {names}",
              "a RoCE port whose netdev is Down cannot carry traffic: `ip link set <netdev> up`, "
              "check cable and switch port; ignore if the topology does not use it")
    if down_ib:
        vfs = sum(n.vf for n in down_ib)
        j.add(WARN, f"{len(down_ib)} IPoIB netdev(s) Down"
              + (f" ({vfs} of them VFs)" if vfs else ""),
              "IPoIB Down does not stop InfiniBand verbs (check port state with `ibstat`); a VF "
              "also needs a GUID and a subnet manager with virtualization enabled")
    if not down:
        j.add(PASS, f"{len(links)} netdev(s) Up")
    return j


def _ipv4_of(row: GidRow) -> str | None:
    if row.ipv4:
        return row.ipv4
    try:
        mapped = ipaddress.IPv6Address(row.gid).ipv4_mapped
    except ValueError:
        return None
    return str(mapped) if mapped else None


def recommend_gid(rows: list[GidRow]) -> dict[str, tuple[int, str, str]]:
    """Per device: (index, address, kind) of the RoCE v2 GID to use; IPv4 first, then a global
    IPv6 one ('' when none usable)."""
    best: dict[str, tuple[int, str, str]] = {}
    for r in sorted(rows, key=lambda r: (r.device, r.index)):
        if r.version != "v2" or not r.gid.strip("0:"):
            continue
        v4 = _ipv4_of(r)
        if v4:
            if best.get(r.device, (0, "", ""))[2] != "ipv4":
                best[r.device] = (r.index, v4, "ipv4")
        elif not r.gid.startswith("fe80") and r.device not in best:
            best[r.device] = (r.index, r.gid, "ipv6")
    return best


def judge_show_gids(rows: list[GidRow], text: str = "") -> Judgement:
    best = recommend_gid(rows)
    devices = sorted({r.device for r in rows})
    j = Judgement("show_gids", {
        "gids": [{"device": r.device, "port": r.port, "index": r.index, "gid": r.gid,
                  "ipv4": _ipv4_of(r) or "", "version": r.version, "netdev": r.netdev}
                 for r in rows],
        "recommended_gid_index": {d: best[d][0] for d in best}})
    if not rows:
        if re.search(r"^\s*DEV\s+PORT\s+INDEX\s+GID", text, re.M):
            j.add(FAIL, "the GID table is empty (show_gids found no GID)",
                  "the RDMA device has no address in this network namespace: in a pod whose "
                  "network is a veth (calico, flannel) the NIC's netdev is not there; attach the "
                  "NIC with macvlan / host-device / SR-IOV CNI or use the host network, and give "
                  "its netdev an IP")
        else:
            j.add(FAIL, "no GID rows (DEV PORT INDEX GID IPv4 VER DEV) in the text",
                  "run `show_gids` (or read /sys/class/infiniband/*/ports/*/gids/*) and save it all")
        return j
    v4 = {d: b for d, b in best.items() if b[2] == "ipv4"}
    for dev in devices:
        if dev in v4:
            idx, addr, _ = v4[dev]
            j.add(PASS, f"{dev}: RoCE v2 IPv4 GID at index {idx} ({addr})",
                  f"set {GID_ENV} to {idx}" if idx != 3 else "")
        elif dev in best:
            idx, addr, _ = best[dev]
            j.add(WARN, f"{dev}: no RoCE v2 GID with an IPv4 address; index {idx} is RoCE v2 "
                        f"over IPv6 ({addr})",
                  f"give the netdev an IPv4 address (its GID then appears), or use index {idx} on "
                  f"both ends: {GID_ENV}")
        else:
            j.add(WARN, f"{dev}: only link-local or RoCE v1 GIDs",
                  "assign an IP address to the port's netdev; RoCE v2 needs a routable GID")
    idxs = {b[0] for b in v4.values()}
    if len(idxs) > 1:
        j.add(WARN, f"the RoCE v2 IPv4 GID index differs between devices: {sorted(idxs)}",
              "one GID index env var applies to every NIC of a process: make the GID tables "
              "agree or give each worker only NICs with the same index")
    return j
