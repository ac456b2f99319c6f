"""NIC checks: RDMA device present, port ACTIVE, link layer and rate as declared, GID and MTU
usable (ibv_devinfo/ibstat), and plain interfaces up with their declared address (ip addr)."""

from __future__ import annotations

import ipaddress

from epdctl.preflight import parsers
from epdctl.preflight.records import RDMA_KINDS, CheckItem, Facts, NicExpect, NodeExpect
from epdctl.preflight.records import item as _item

_LAYER = {"ib": "InfiniBand", "roce": "Ethernet"}
MIN_ACTIVE_MTU = 1024


def rdma_ports(facts: Facts) -> tuple[dict[str, parsers.IbPort], str | None]:
    """Ports by device name (first port of each), merging ``ibv_devinfo -v`` with ``ibstat``."""
    merged: dict[str, parsers.IbPort] = {}
    devinfo, ibstat = facts.out("ibv_devinfo"), facts.out("ibstat")
    if devinfo is None and ibstat is None:
        return {}, f"ibv_devinfo {facts.why_missing('ibv_devinfo')}"
    for p in parsers.parse_ibv_devinfo(devinfo or ""):
        merged.setdefault(p.device, p)
    for p in parsers.parse_ibstat(ibstat or ""):
        old = merged.get(p.device)
        if old is None:
            merged[p.device] = p
        elif old.rate_gbps is None or not old.link_layer:
            merged[p.device] = parsers.IbPort(
                old.device, old.port, old.state or p.state, old.phys_state or p.phys_state,
                old.link_layer or p.link_layer, old.rate_gbps if old.rate_gbps else p.rate_gbps,
                old.active_mtu, old.max_mtu, old.gids, old.gid_types)
    return merged, None


def check_nics(expect: NodeExpect, facts: Facts) -> list[CheckItem]:
    items: list[CheckItem] = []
    ifaces = _ifaces(facts)
    rdma = [n for n in expect.nics if n.kind in RDMA_KINDS]
    ports, why = rdma_ports(facts) if rdma else ({}, None)
    for nic in expect.nics:
        tag = f"nic {nic.name}"
        if nic.kind not in RDMA_KINDS:
            items.append(_check_eth(expect, nic, ifaces))
            continue
        port = ports.get(nic.name)
        if port is None:
            have = ", ".join(sorted(ports)) or "none"
            reason = why or f"RDMA devices present: {have}"
            items.append(_item(expect, f"{tag} device", False,
                               f"RDMA device {nic.name} not found ({reason}); fix the NIC name in "
                               f"the topology or load the driver"))
            continue
        items.append(_item(expect, f"{tag} device", True, f"{nic.name} port {port.port}"))
        active = port.state == "ACTIVE"
        phys = f", physical {port.phys_state}" if port.phys_state else ""
        items.append(_item(expect, f"{tag} state", active,
                           f"port {port.port} {port.state or 'unknown'}{phys}" + (
                               "" if active else "; bring the link up (cable, switch port, "
                               "subnet manager for InfiniBand)")))
        want = _LAYER[nic.kind]
        if port.link_layer:
            ok = port.link_layer == want
            items.append(_item(expect, f"{tag} link layer", ok,
                               f"{port.link_layer}" + ("" if ok else
                               f", but the topology declares kind {nic.kind} ({want}); fix the "
                               f"NIC kind or the port's link type")))
        if nic.speed_gbps and port.rate_gbps is not None:
            ok = port.rate_gbps + 1e-9 >= nic.speed_gbps
            items.append(_item(expect, f"{tag} rate", ok,
                               f"{port.rate_gbps:g} Gb/s" + ("" if ok else
                               f", below the declared {nic.speed_gbps:g} Gb/s (degraded link "
                               f"width/speed or wrong NIC)")))
        items += _check_gid_mtu(expect, nic, port)
        if nic.ip:
            items.append(_check_ip(expect, nic, ifaces))
    return items


def _check_gid_mtu(expect: NodeExpect, nic: NicExpect, port: parsers.IbPort) -> list[CheckItem]:
    items = []
    tag = f"nic {nic.name}"
    if port.active_mtu is not None:
        ok = port.active_mtu >= MIN_ACTIVE_MTU
        items.append(_item(expect, f"{tag} mtu", ok, f"active MTU {port.active_mtu}" + (
            "" if ok else f" (< {MIN_ACTIVE_MTU}); raise the MTU of the port or its netdev, and "
            f"match MC_MTU")))
    if port.gids:
        usable = {i: g for i, g in port.gids.items() if not _zero_gid(g)}
        if not usable:
            items.append(_item(expect, f"{tag} gid", False,
                               "every GID is all-zero; the port has no address (RoCE: no IP on "
                               "its netdev; set MC_GID_INDEX to a valid index)"))
        elif nic.kind == "roce" and nic.ip:
            idx = [i for i, g in usable.items() if _gid_ipv4(g) == nic.ip
                   and port.gid_types.get(i, "RoCE v2") == "RoCE v2"]
            items.append(_item(expect, f"{tag} gid", bool(idx),
                               f"RoCE v2 GID index {idx[0]} maps {nic.ip}" if idx else
                               f"no RoCE v2 GID maps {nic.ip}; check the netdev's IP and "
                               f"MC_GID_INDEX"))
        else:
            items.append(_item(expect, f"{tag} gid", True, f"{len(usable)} usable GID(s)"))
    return items


def _zero_gid(gid: str) -> bool:
    return not gid.replace(":", "").strip("0")


def _gid_ipv4(gid: str) -> str | None:
    try:
        addr = ipaddress.IPv6Address(gid)
    except ValueError:
        return None
    return str(addr.ipv4_mapped) if addr.ipv4_mapped else None


def _ifaces(facts: Facts) -> list[parsers.NetIface] | None:
    text = facts.out("ip_addr")
    if text is None:
        return None
    try:
        return parsers.parse_ip_j_addr(text)
    except ValueError:
        return parsers.parse_ip_br_addr(text)


def _check_eth(expect: NodeExpect, nic: NicExpect, ifaces: list | None) -> CheckItem:
    tag = f"nic {nic.name}"
    if ifaces is None:
        return _item(expect, f"{tag} device", False, "could not list interfaces (`ip addr` failed)")
    by_name = {i.name: i for i in ifaces}
    it = by_name.get(nic.name)
    if it is None:
        owner = [i.name for i in ifaces if nic.ip and i.holds(nic.ip)]
        hint = f"; {nic.ip} is on {owner[0]}" if owner else ""
        return _item(expect, f"{tag} device", False,
                     f"interface {nic.name} not found (have {', '.join(sorted(by_name))}){hint}")
    if it.state not in ("UP", "UNKNOWN"):
        return _item(expect, f"{tag} device", False, f"interface {nic.name} is {it.state}")
    if nic.ip and not it.holds(nic.ip):
        return _item(expect, f"{tag} device", False,
                     f"{nic.ip} is not an address of {nic.name} ({', '.join(it.addrs) or 'none'})")
    return _item(expect, f"{tag} device", True, f"{nic.name} {it.state}"
                 + (f" {nic.ip}" if nic.ip else ""))


def _check_ip(expect: NodeExpect, nic: NicExpect, ifaces: list | None) -> CheckItem:
    if ifaces is None:
        return _item(expect, f"nic {nic.name} ip", False, "could not list interfaces")
    owner = [i.name for i in ifaces if nic.ip and i.holds(nic.ip)]
    return _item(expect, f"nic {nic.name} ip", bool(owner),
                 f"{nic.ip} on {owner[0]}" if owner else f"{nic.ip} is on no interface of the node")
