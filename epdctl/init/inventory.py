"""What one node has, read from the preflight agent's facts with the preflight parsers: GPUs
(nvidia-smi), RDMA NICs (ibv_devinfo/ibstat: link layer -> ib/roce, rate, RoCE GID address) and
plain Ethernet interfaces (ip -j addr, speed from /sys/class/net/*/speed)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from epdctl.preflight import parsers
from epdctl.preflight.nic_checks import rdma_ports
from epdctl.preflight.records import Facts

# interfaces that never carry inter-node traffic of a serving cluster
_VIRTUAL = ("lo", "docker", "veth", "br-", "virbr", "cni", "flannel", "cali", "tun", "tap", "vxlan", "kube")
_SPEED = re.compile(r"^/sys/class/net/([^/]+)/speed:(-?\d+)$")


@dataclass(frozen=True)
class FoundNic:
    name: str
    kind: str                      # ib | roce | eth
    ip: str | None = None
    speed_gbps: float | None = None
    note: str = ""                 # e.g. "port DOWN when init ran"


@dataclass(frozen=True)
class Inventory:
    gpus: tuple[parsers.Gpu, ...] = ()
    nics: tuple[FoundNic, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def rdma(self) -> tuple[FoundNic, ...]:
        return tuple(n for n in self.nics if n.kind in ("ib", "roce"))


def _gid_ipv4(gids: dict[int, str]) -> str | None:
    for _, gid in sorted(gids.items()):
        try:
            mapped = ipaddress.IPv6Address(gid).ipv4_mapped
        except ValueError:
            continue
        if mapped is not None:
            return str(mapped)
    return None


def _gpus(facts: Facts) -> tuple[tuple[parsers.Gpu, ...], str | None]:
    csv, listing = facts.out("nvidia_smi"), facts.out("nvidia_smi_L")
    try:
        if csv:
            return tuple(parsers.parse_nvidia_smi_csv(csv)), None
        if listing:
            return tuple(parsers.parse_nvidia_smi_list(listing)), None
    except ValueError as e:
        return (), f"nvidia-smi output not understood ({e})"
    return (), f"no GPUs: nvidia-smi {facts.why_missing('nvidia_smi')}"


def _speeds(facts: Facts) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in (facts.out("net_speed") or "").splitlines():
        m = _SPEED.match(line.strip())
        if m and int(m.group(2)) > 0:
            out[m.group(1)] = int(m.group(2)) / 1000.0
    return out


def inventory(facts: Facts) -> Inventory:
    """GPUs and NICs of one node; what could not be read becomes a note, never an error."""
    notes: list[str] = []
    gpus, why = _gpus(facts)
    if why:
        notes.append(why)
    nics: list[FoundNic] = []
    ports, why_rdma = rdma_ports(facts)
    for dev, p in sorted(ports.items()):
        kind = {"InfiniBand": "ib", "Ethernet": "roce"}.get(p.link_layer)
        if kind is None:
            notes.append(f"RDMA device {dev}: link layer not reported; add it by hand as kind ib or roce")
            continue
        note = "" if p.state == "ACTIVE" else f"port {p.port} was {p.state} when init ran"
        nics.append(FoundNic(dev, kind, _gid_ipv4(p.gids) if kind == "roce" else None, p.rate_gbps, note))
    if not ports:
        notes.append(f"no RDMA NIC ({why_rdma})" if why_rdma else "no RDMA NIC found")
    speeds = _speeds(facts)
    try:
        ifaces = parsers.parse_ip_j_addr(facts.out("ip_addr") or "[]")
    except (ValueError, KeyError) as e:
        ifaces = []
        notes.append(f"ip -j addr not understood ({e})")
    for it in ifaces:
        v4 = [a for a in it.addrs if ":" not in a]
        if it.name.startswith(_VIRTUAL) or not v4 or it.state == "DOWN":
            continue
        nics.append(FoundNic(it.name, "eth", v4[0], speeds.get(it.name)))
    return Inventory(gpus, tuple(nics), tuple(notes))
