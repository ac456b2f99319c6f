"""Judge RDMA ports read from ``ibv_devinfo``/``ibstat``/``ibstatus``: state with advice specific
to the cause, and the secondary facts that break transfers quietly (no subnet manager, an
all-zero GUID, an MTU below the port's maximum, rails at different rates).

Without a topology a port that is down may simply be unused, so "some ports down" is a warning
and "no port active" a failure; `epdctl check` fails exactly the ports the topology declares.
"""

from __future__ import annotations

from typing import Any

from epdctl.preflight.judgement import FAIL, PASS, WARN, Judgement
from epdctl.preflight.rdma_text import NO_DEVICE, IbPort, RdmaRead


def port_problem(p: IbPort) -> tuple[str, str] | None:
    """(message, advice) when the port cannot carry traffic, specific to its states."""
    phys = p.phys_state.replace("_", "")
    where = f"{p.device} port {p.port}"
    if p.state == "ACTIVE":
        return None
    if p.state == "INIT":
        return (f"{where} is INIT (physical {p.phys_state or 'link up'}): the link trained but no "
                f"subnet manager configured it",
                "start a subnet manager on the fabric (opensm, UFM or the switch's SM); an SR-IOV "
                "VF also needs an SM with virtualization enabled and a GUID assigned to the VF")
    if p.state == "ARMED":
        return (f"{where} is ARMED: the subnet manager has not finished activating it",
                "wait for the SM sweep or restart the subnet manager; check `sminfo`")
    if phys == "DISABLED":
        return (f"{where} is {p.state or 'not active'} and administratively disabled",
                "enable it (`ibportstate <lid> <port> enable` for InfiniBand, `ip link set "
                "<netdev> up` for RoCE); if the port is unused, leave it out of the topology")
    if phys == "POLLING":
        return (f"{where} is {p.state or 'DOWN'}, physical state POLLING: no link partner",
                "check the cable/transceiver and that the switch port (or peer NIC) is up")
    if phys == "LINKUP" and p.link_layer == "InfiniBand":
        return (f"{where} is {p.state or 'DOWN'} although the physical link is up",
                "the subnet manager has not admitted the port: check that an SM runs (`sminfo`); "
                "for an SR-IOV VF the SM needs virtualization enabled and the VF a unique "
                "node/port GUID (`ip link set <pf> vf <n> node_guid ... port_guid ...`)")
    if phys == "LINKUP":
        return (f"{where} is {p.state or 'DOWN'} although the physical link is up",
                "the port's netdev is probably administratively down: `ip link set <netdev> up` "
                "(find it with ibdev2netdev); for InfiniBand check the subnet manager")
    return (f"{where} is {p.state or 'in an unknown state'}"
            + (f" (physical {p.phys_state})" if p.phys_state else ""),
            "check cable and switch port; for InfiniBand, that a subnet manager runs")


def port_facts(p: IbPort) -> dict[str, Any]:
    d: dict[str, Any] = {"device": p.device, "port": p.port, "state": p.state,
                         "phys_state": p.phys_state, "link_layer": p.link_layer,
                         "rate_gbps": p.rate_gbps, "active_mtu": p.active_mtu, "max_mtu": p.max_mtu}
    for k in ("lid", "sm_lid"):
        if getattr(p, k) is not None:
            d[k] = getattr(p, k)
    if p.gids:
        d["gids"] = {str(i): g for i, g in sorted(p.gids.items())}
    if p.gid_types:
        d["gid_types"] = {str(i): t for i, t in sorted(p.gid_types.items())}
    return d


def zero_guid(guid: str) -> bool:
    digits = guid.lower().removeprefix("0x").replace(":", "")
    return bool(digits) and not digits.strip("0") and all(c in "0123456789abcdef" for c in digits)


def judge_ports(tool: str, read: RdmaRead) -> Judgement:
    j = Judgement(tool, {"ports": [port_facts(p) for p in read.ports]})
    for err in dict.fromkeys(read.errors):
        if read.ports and "couldn't load driver" in err:
            continue        # a provider for a NIC type this node does not have: harmless
        n = read.errors.count(err)
        j.add(WARN if read.ports else FAIL,
              f"{tool} says: {err}" + (f" (x{n})" if n > 1 else ""), _error_advice(err))
    if not read.ports:
        if not read.errors:
            j.add(FAIL, "no RDMA port in the text",
                  "load the RDMA driver (mlx5_ib / irdma / rdma_rxe) and its userspace provider "
                  "(rdma-core), then run the tool again")
        return j
    for note in read.notes:
        j.add(WARN, note, "paste the whole output so every device can be judged")
    bad = [(p, why) for p in read.ports if (why := port_problem(p)) is not None]
    active = [p for p in read.ports if p.state == "ACTIVE"]
    for p, (msg, advice) in bad:
        j.add(FAIL if not active else WARN, msg, advice)
    for p in active:
        if p.gids and p.link_layer == "Ethernet" and all(zero_guid(g) or not g.strip(":0")
                                                         for g in p.gids.values()):
            j.add(FAIL, f"{p.device} port {p.port}: every GID is all-zero (a RoCE port with no "
                        f"address)", "give the port's netdev an IP address (its RoCE v2 GID "
                        "appears), and point MC_GID_INDEX / NCCL_IB_GID_INDEX at it")
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for p in read.ports:
        for level, msg, advice, where in secondary_findings(p):
            grouped.setdefault((level, msg, advice), []).append(where)
    for (level, msg, advice), wheres in grouped.items():
        j.add(level, f"{', '.join(wheres)}: {msg}", advice)
    _mixed_rates(j, active)
    if active and not bad:
        j.add(PASS, f"{len(active)} port(s) ACTIVE")
    return j


def _error_advice(err: str) -> str:
    if "Failed to open device" in err:
        return ("a device is listed but cannot be opened here (a VF not passed into this "
                "container, or a driver problem); the devices shown were judged")
    if "no userspace device-specific driver" in err or "couldn't load driver" in err:
        return "install the rdma-core provider for this NIC (libmlx5 / libirdma ...)"
    if "sys files not found" in err:
        return ("no RDMA device in sysfs (/sys/class/infiniband is empty or missing): load the "
                "kernel driver (mlx5_ib, irdma) and check `dmesg` for firmware errors; in a container "
                "mount /sys/class/infiniband and pass /dev/infiniband")
    if "No IB devices found" in err or "Function not implemented" in err:
        return ("no RDMA device is visible: load the kernel driver (mlx5_ib, irdma), and in a "
                "container pass /dev/infiniband (--device=/dev/infiniband) or an RDMA device plugin")
    if err.startswith("ibpanic") or err.startswith("ibwarn"):
        return "the tool stopped at this device: check that it still exists (`ls /sys/class/infiniband`)"
    return ""


def secondary_findings(p: IbPort) -> list[tuple[str, str, str, str]]:
    """(level, message, advice, where) for what works but is wrong-ish about a port."""
    where = f"{p.device} port {p.port}" if p.device != NO_DEVICE else f"port {p.port}"
    out = []
    if p.link_layer == "InfiniBand" and p.state == "ACTIVE" and (
            p.lid in (0, 65535) or p.sm_lid == 0):
        out.append((WARN, f"InfiniBand port without a valid LID/SM LID (LID {p.lid}, SM LID "
                          f"{p.sm_lid})",
                    "no subnet manager has assigned addresses: start opensm/UFM on the fabric", where))
    elif p.link_layer == "InfiniBand" and p.state != "ACTIVE" and p.lid == 65535:
        out.append((WARN, "LID 65535 (unassigned)", "a subnet manager must run on the fabric", where))
    for kind, guid in (("node", p.node_guid), ("port", p.port_guid)):
        if not zero_guid(guid):
            continue
        if kind == "port" and p.link_layer == "Ethernet":
            out.append((WARN, "all-zero port GUID on a RoCE port (its GID 0 is empty)",
                        "RoCE GIDs come from the netdev's addresses: this netdev has no IPv6 "
                        "link-local address (IPv6 disabled?); make sure a RoCE v2 IPv4 GID exists "
                        "(show_gids)", where))
        else:
            out.append((WARN, f"all-zero {kind} GUID",
                        "typical of an SR-IOV VF whose GUID was never assigned: `ip link set <pf> "
                        "vf <n> node_guid <guid> port_guid <guid>` (unique per VF), then rebind "
                        "the VF", where))
    if p.active_mtu and p.max_mtu and p.active_mtu < p.max_mtu and p.state == "ACTIVE":
        out.append((WARN, f"active MTU {p.active_mtu} below the port's max {p.max_mtu}",
                    "RoCE: raise the netdev MTU (>= 4200 gives RDMA MTU 4096) on every node and "
                    "switch port; both ends negotiate the smaller MTU", where))
    return out


def _mixed_rates(j: Judgement, active: list[IbPort]) -> None:
    by_layer: dict[str, dict[float, list[str]]] = {}
    for p in active:
        if p.rate_gbps:
            by_layer.setdefault(p.link_layer or "?", {}).setdefault(p.rate_gbps, []).append(p.device)
    for layer, rates in by_layer.items():
        if len(rates) > 1:
            desc = "; ".join(f"{r:g} Gb/s: {', '.join(sorted(set(d)))}" for r, d in sorted(rates.items()))
            j.add(WARN, f"{layer} ports run at different rates ({desc})",
                  "rails at a lower rate cap every transfer striped over them: check cables "
                  "and link width (`mlxlink`), or keep the slower ports out of the topology")


def judge_device_list(rows: list[tuple[str, str]]) -> Judgement:
    """``ibv_devices`` / ``ibv_devinfo -l``: which devices exist, not whether their ports work."""
    j = Judgement("ibv_devices", {"devices": [{"device": d, "node_guid": g} for d, g in rows]})
    if not rows:
        j.add(FAIL, "the device list is empty", "load the RDMA driver and its rdma-core provider")
        return j
    j.add(WARN, f"{len(rows)} device(s) listed, but a device list says nothing about port state",
          "run `ibv_devinfo` or `ibstat` (or `epdctl check`) for the ports' state, rate and GIDs")
    zero = [d for d, g in rows if g and zero_guid(g)]
    if zero:
        j.add(WARN, f"all-zero node GUID: {', '.join(zero)}",
              "a VF whose GUID was never assigned: `ip link set <pf> vf <n> node_guid <guid>`")
    return j
