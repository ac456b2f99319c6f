"""NIC checks: RDMA device present, port ACTIVE (with advice specific to INIT / POLLING /
DISABLED / link-up-but-down), link layer and rate as declared, GID and MTU usable, and the
secondary facts as warnings (no subnet manager, all-zero GUID, MTU below max, rails at mixed
rates); plain interfaces up with their declared address (ip addr).

Tool output is read whatever the tool's exit status (ibv_devinfo exits 1 when one device fails
to open, while printing the healthy ones).
"""

from __future__ import annotations

import ipaddress

from epdctl.preflight import parsers, rdma_judge, rdma_netdev, rdma_text
from epdctl.preflight.diagnose import unrecognised
from epdctl.preflight.records import RDMA_KINDS, CheckItem, Facts, NicExpect, NodeExpect
from epdctl.preflight.records import item as _item
from epdctl.preflight.records import leveled

_LAYER = {"ib": "InfiniBand", "roce": "Ethernet"}
MIN_ACTIVE_MTU = 1024


def rdma_ports(facts: Facts) -> tuple[dict[str, rdma_text.IbPort], str | None]:
    """Ports by device name (port 1, else the device's first port): see :func:`rdma_port_map`."""
    by_port, why = rdma_port_map(facts)
    return {d: ports.get(1) or ports[min(ports)] for d, ports in by_port.items()}, why


def rdma_port_map(facts: Facts) -> tuple[dict[str, dict[int, rdma_text.IbPort]], str | None]:
    """Every port by device and port number, merging ``ibv_devinfo -v``, ``ibstat`` and the
    agent's sysfs rendering of ``ibstatus`` (present even where the tools are not installed)."""
    merged: dict[tuple[str, int], rdma_text.IbPort] = {}
    errors: list[str] = []
    seen_text = False
    for probe, reader in (("ibv_devinfo", rdma_text.read_ibv_devinfo),
                          ("ibstat", rdma_text.read_ibstat),
                          ("ibstatus", rdma_text.read_ibstatus)):    # ibstatus: from sysfs
        text = facts.text(probe)
        if text is None:
            continue
        seen_text = True
        got = reader(text)
        errors += got.errors
        for p in got.ports:
            if p.device == rdma_text.NO_DEVICE:
                continue
            old = merged.get((p.device, p.port))
            merged[(p.device, p.port)] = p if old is None else rdma_text.merge(old, p)
    if not seen_text:
        return {}, f"ibv_devinfo {facts.why_missing('ibv_devinfo')}"
    if not merged:
        odd = unrecognised(facts.text("ibv_devinfo"), ("ibv_devinfo",))
        said = "; ".join(dict.fromkeys(errors)) or odd or facts.why_missing("ibv_devinfo")
        return {}, f"the RDMA tools list no device ({said})"
    out: dict[str, dict[int, rdma_text.IbPort]] = {}
    for (dev, num), port in merged.items():
        out.setdefault(dev, {})[num] = port
    return out, None


def check_nics(expect: NodeExpect, facts: Facts) -> list[CheckItem]:
    items: list[CheckItem] = []
    ifaces = _ifaces(facts)
    rdma = [n for n in expect.nics if n.kind in RDMA_KINDS]
    by_port, why = rdma_port_map(facts) if rdma else ({}, None)
    gid_rows = _gid_rows(facts) if rdma else []
    netdevs = rdma_netdev.read_ibdev2netdev(facts.text("ibdev2netdev") or "") if rdma else []
    for nic in expect.nics:
        tag = f"nic {nic.name}"
        if nic.kind not in RDMA_KINDS:
            items.append(_check_eth(expect, nic, ifaces))
            continue
        dev_ports = by_port.get(nic.name, {})
        want_port = nic.port or 1
        port = dev_ports.get(want_port) if (nic.port or 1 in dev_ports) else (
            dev_ports[min(dev_ports)] if dev_ports else None)
        if port is None and dev_ports:  # the device is there, the port the topology uses is not
            items.append(_item(expect, f"{tag} device", False,
                               f"{nic.name} has no port {want_port} (ports: "
                               f"{', '.join(map(str, sorted(dev_ports)))}); fix port: in the topology"))
            continue
        items += _port_siblings(expect, nic, port, dev_ports)
        items += _netdev_items(expect, nic, [n for n in netdevs if n.device == nic.name])
        rows = [r for r in gid_rows if r.device == nic.name]
        if port is None and (rows or any(n.device == nic.name for n in netdevs)):
            down = [n for n in netdevs if n.device == nic.name and not n.up]
            # the function the topology uses, unreadable and its netdev Down: it cannot carry traffic
            items.append(leveled(expect, f"{tag} device", "fail" if down else "warn",
                                 f"{nic.name} is listed (GID table / netdev map) but its port "
                                 f"state could not be read ({why or 'no port section'})"
                                 + (f"; its netdev {down[0].netdev}{' (a VF)' if down[0].vf else ''} "
                                    f"is Down: the topology uses this function" if down else "")))
            if nic.kind == "roce" and rows:
                items.append(_gid_from_table(expect, nic, rows))
            continue
        if port is None:
            have = ", ".join(sorted(by_port)) or "none"
            reason = why or f"RDMA devices present: {have}"
            items.append(_item(expect, f"{tag} device", False,
                               f"RDMA device {nic.name} not found ({reason}); fix the NIC name in "
                               f"the topology or load the driver"))
            continue
        items.append(_item(expect, f"{tag} device", True, f"{nic.name} port {port.port}"))
        problem = rdma_judge.port_problem(port)
        phys = f", physical {port.phys_state}" if port.phys_state else ""
        items.append(_item(expect, f"{tag} state", problem is None,
                           f"port {port.port} {port.state or 'unknown'}{phys}"
                           + (f"; {problem[1]}" if problem else "")))
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
        items += _check_gid_mtu(expect, nic, port, rows)
        for level, msg, advice, _ in rdma_judge.secondary_findings(port):
            if "MTU" not in msg:
                key = "guid" if "GUID" in msg else "lid"
                items.append(leveled(expect, f"{tag} {key}", level, f"{msg}; {advice}"))
        if nic.ip:
            items.append(_check_ip(expect, nic, ifaces))
    used = [p for n in rdma for p in [by_port.get(n.name, {}).get(n.port or 1)] if p is not None]
    items += _mixed_rates(expect, used)
    return items


def _port_siblings(expect: NodeExpect, nic: NicExpect, port: rdma_text.IbPort | None,
                   dev_ports: dict[int, rdma_text.IbPort]) -> list[CheckItem]:
    """A multi-port HCA: the port the topology uses is judged (state item); a down port it does
    not use is only named, so the operator knows which port carries the traffic."""
    if port is None or len(dev_ports) < 2:
        return []
    down = [p for n, p in sorted(dev_ports.items()) if n != port.port and rdma_judge.port_problem(p)]
    if not down:
        return []
    names = ", ".join(f"{p.port} ({p.state or '?'})" for p in down)
    return [leveled(expect, f"nic {nic.name} other ports", "warn",
                    f"port {port.port} is the one the topology uses; unused port(s) {names} not active "
                    f"(fine unless a worker should use them: then set port: on the NIC)")]


def _netdev_items(expect: NodeExpect, nic: NicExpect, links: list[rdma_netdev.NetdevLink]
                  ) -> list[CheckItem]:
    """RoCE needs its netdev up; IPoIB down is only worth a word. VFs are named as such."""
    out = []
    for n in links:
        vf = " (a VF)" if n.vf else ""
        if n.up:
            out.append(_item(expect, f"nic {nic.name} netdev", True, f"{n.netdev} Up{vf}"))
        elif nic.kind == "roce":
            out.append(_item(expect, f"nic {nic.name} netdev", False,
                             f"{n.netdev}{vf} is Down: RoCE traffic cannot flow; `ip link set "
                             f"{n.netdev} up`, check cable and switch port"))
        else:
            out.append(leveled(expect, f"nic {nic.name} netdev", "warn",
                               f"IPoIB {n.netdev}{vf} is Down (InfiniBand verbs do not need it; "
                               f"the engine's TCP handshake over this NIC's IP does)"))
    return out


def _mixed_rates(expect: NodeExpect, used: list[rdma_text.IbPort]) -> list[CheckItem]:
    rates = {p.rate_gbps for p in used if p.rate_gbps and p.state == "ACTIVE"}
    if len(rates) < 2:
        return []
    desc = ", ".join(f"{p.device} {p.rate_gbps:g}" for p in used if p.rate_gbps)
    return [leveled(expect, "rails rate", "warn",
                    f"the declared RDMA NICs run at different rates ({desc} Gb/s): transfers "
                    f"striped over them are capped by the slowest; check cables/width (mlxlink)")]


def _gid_rows(facts: Facts) -> list[rdma_netdev.GidRow]:
    text = facts.text("gid_table")
    return rdma_netdev.read_show_gids(text) if text else []


def _check_gid_mtu(expect: NodeExpect, nic: NicExpect, port: rdma_text.IbPort,
                   rows: list[rdma_netdev.GidRow]) -> list[CheckItem]:
    items = []
    tag = f"nic {nic.name}"
    if port.active_mtu is not None:
        ok = port.active_mtu >= MIN_ACTIVE_MTU
        items.append(_item(expect, f"{tag} mtu", ok, f"active MTU {port.active_mtu}" + (
            "" if ok else f" (< {MIN_ACTIVE_MTU}); raise the MTU of the port or its netdev, and "
            f"match MC_MTU")))
        if ok and port.max_mtu and port.active_mtu < port.max_mtu:
            items.append(leveled(expect, f"{tag} mtu max", "warn",
                                 f"active MTU {port.active_mtu} below the port's max "
                                 f"{port.max_mtu}; raise the netdev MTU (>= 4200) on both ends"))
    if nic.kind == "roce" and rows:
        items.append(_gid_from_table(expect, nic, rows))
        return items
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
                               f"RoCE v2 GID index {idx[0]} maps {nic.ip}" + (
                                   f"; set {rdma_netdev.GID_ENV} to {idx[0]}" if idx[0] != 3
                                   else "") if idx else
                               f"no RoCE v2 GID maps {nic.ip}; check the netdev's IP and "
                               f"MC_GID_INDEX"))
        else:
            items.append(_item(expect, f"{tag} gid", True, f"{len(usable)} usable GID(s)"))
    return items


def _gid_from_table(expect: NodeExpect, nic: NicExpect, rows: list[rdma_netdev.GidRow]
                    ) -> CheckItem:
    tag = f"nic {nic.name} gid"
    if nic.ip:
        match = [r for r in rows if r.version == "v2" and (r.ipv4 == nic.ip or _gid_ipv4(r.gid)
                                                           == nic.ip)]
        if match:
            idx = match[0].index
            return _item(expect, tag, True, f"RoCE v2 GID index {idx} maps {nic.ip}" + (
                f"; set {rdma_netdev.GID_ENV} to {idx}" if idx != 3 else ""))
        return _item(expect, tag, False, f"no RoCE v2 GID maps {nic.ip} (GID table: "
                     f"{', '.join(f'{r.index}:{r.ipv4 or r.gid}/{r.version}' for r in rows)}); "
                     f"put {nic.ip} on the port's netdev")
    best = rdma_netdev.recommend_gid(rows).get(nic.name)
    if best is None:
        return _item(expect, tag, False, "no routable RoCE v2 GID; give the port's netdev an IP")
    level = "ok" if best[2] == "ipv4" else "warn"
    return leveled(expect, tag, level, f"RoCE v2 GID index {best[0]} ({best[1]}); set "
                   f"{rdma_netdev.GID_ENV} to {best[0]} if it is not 3")


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
