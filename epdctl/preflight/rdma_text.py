"""Readers for the RDMA tools' text: ``ibv_devinfo`` (plain and ``-v``), ``ibstat``, ``ibstatus``.

They never raise: whatever they cannot place is counted in ``RdmaRead.unread`` or named in
``RdmaRead.notes`` (a port section with no ``hca_id``, a device with no port section, a device
that failed to open, an ``ibpanic`` line), so the judge can say what it could not read.
Indentation is not trusted (pastes flatten it); keys are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from epdctl.preflight.judgement import digits

_WIDTH_LANES = {"1X": 1, "2X": 2, "4X": 4, "8X": 8, "12X": 12}
NO_DEVICE = "?"   # device name of a port section whose hca_id is not in the text


@dataclass(frozen=True)
class IbPort:
    """One port of an RDMA device, as ``ibv_devinfo``, ``ibstat`` or ``ibstatus`` describe it."""

    device: str
    port: int
    state: str                      # ACTIVE | DOWN | INIT | ARMED ... (upper case)
    phys_state: str = ""            # LINKUP | LINK_UP | POLLING | DISABLED ... ('' if not printed)
    link_layer: str = ""            # InfiniBand | Ethernet | '' (old ibv_devinfo omits it)
    rate_gbps: float | None = None  # ibstat "Rate", or width x speed from ibv_devinfo -v
    active_mtu: int | None = None
    max_mtu: int | None = None
    gids: dict[int, str] = field(default_factory=dict)
    gid_types: dict[int, str] = field(default_factory=dict)   # index -> "RoCE v2" / "RoCE v1" / "IB"
    lid: int | None = None
    sm_lid: int | None = None
    node_guid: str = ""
    port_guid: str = ""


@dataclass
class RdmaRead:
    ports: list[IbPort] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)        # every device named, in order
    notes: list[str] = field(default_factory=list)          # what was odd, for warn findings
    errors: list[str] = field(default_factory=list)         # tool error lines, quoted


_SAME_STATE = {"INITIALIZING": "INIT", "INITIALIZE": "INIT", "NOP": "DOWN"}


def state_word(value: str) -> str:
    """``PORT_ACTIVE (4)`` / ``Active`` / ``4: ACTIVE`` / ``LINK_UP (5)`` -> ``ACTIVE`` / ``LINK_UP``;
    ibstat's ``Initializing`` is the port state INIT."""
    v = re.sub(r"\(\d+\)", "", value).strip()
    v = v.split(":", 1)[-1].strip().upper().removeprefix("PORT_")
    return _SAME_STATE.get(v, v)


def _int(value: str) -> int | None:
    m = re.match(r"\s*(0x[0-9a-fA-F]+|\d+)", value)
    return int(m.group(1), 0) if m else None


def _float(value: str) -> float | None:
    m = re.match(r"\s*(\d+(?:\.\d+)?)", value)
    return float(m.group(1)) if m else None


_DEVINFO_ERRORS = ("Failed to open device", "No IB devices found", "Failed to get IB devices list",
                   "no userspace device-specific driver", "Function not implemented",
                   "couldn't load driver")


def read_ibv_devinfo(text: str) -> RdmaRead:
    out = RdmaRead()
    device: str | None = None
    node_guid = ""
    cur: dict | None = None

    def flush() -> None:
        nonlocal cur
        if cur is not None:
            width, speed = cur.pop("width", None), cur.pop("speed", None)
            if cur.get("rate_gbps") is None and width in _WIDTH_LANES and speed is not None:
                cur["rate_gbps"] = _WIDTH_LANES[width] * speed
            out.ports.append(IbPort(**cur))
        cur = None

    def start(dev: str, port: int) -> None:
        nonlocal cur
        flush()
        cur = {"device": dev, "port": port, "state": "", "gids": {}, "gid_types": {},
               "node_guid": node_guid}

    for raw in text.splitlines():
        line = raw.strip().strip("*")
        if any(e in line for e in _DEVINFO_ERRORS):
            out.errors.append(line)
            continue
        key, sep, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "hca_id":
            flush()
            device, node_guid = value.split()[0] if value else NO_DEVICE, ""
            out.devices.append(device)
            continue
        if key == "node_guid":
            node_guid = value
            continue
        if key == "port" and digits(value):
            start(device or NO_DEVICE, int(value))
            continue
        if cur is None and key in ("state", "max_mtu", "active_mtu", "link_layer", "port_lid",
                                   "sm_lid", "phys_state", "active_width", "active_speed"):
            start(device or NO_DEVICE, 1)       # port fields before any "port:" line (a cut paste)
        if cur is None or not sep:
            continue
        _devinfo_field(cur, key, value, line)
    flush()
    return _note_gaps(out)


def _devinfo_field(cur: dict, key: str, value: str, line: str) -> None:
    if key == "state":
        cur["state"] = state_word(value)
    elif key == "phys_state":
        cur["phys_state"] = state_word(value)
    elif key == "link_layer":
        cur["link_layer"] = value
    elif key in ("active_mtu", "max_mtu"):
        cur[key] = _int(value)
    elif key in ("port_lid", "port_id"):        # port_id: seen in pastes for port_lid
        cur["lid"] = _int(value)
    elif key == "sm_lid":
        cur["sm_lid"] = _int(value)
    elif key == "active_width":
        cur["width"] = value.split()[0] if value else ""
    elif key == "active_speed":
        cur["speed"] = _float(value)
    else:
        m = re.match(r"GID\[\s*(\d+)\]", key)
        if m:
            gid, _, kind = line.split(":", 1)[1].strip().partition(",")
            cur["gids"][int(m.group(1))] = gid.strip()
            if kind.strip():
                cur["gid_types"][int(m.group(1))] = kind.strip()


def _note_gaps(out: RdmaRead) -> RdmaRead:
    with_ports = {p.device for p in out.ports}
    for dev in out.devices:
        if dev not in with_ports:
            out.notes.append(f"{dev}: no port section in the text (output cut?)")
    if any(p.device == NO_DEVICE for p in out.ports):
        out.notes.append("the text starts inside a port section: its device name is not in it")
    return out


def read_ibstat(text: str) -> RdmaRead:
    out = RdmaRead()
    device: str | None = None
    guid = ""
    cur: dict | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("ibpanic:") or line.startswith("ibwarn: [") and "failed" in line:
            out.errors.append(line)
            continue
        m = re.match(r"CA '([^']+)'", line)
        if m:
            if cur:
                out.ports.append(IbPort(**cur))
            device, guid, cur = m.group(1), "", None
            out.devices.append(device)
            continue
        m = re.match(r"Port (\d+):$", line)
        if m and device is not None:
            if cur:
                out.ports.append(IbPort(**cur))
            cur = {"device": device, "port": int(m.group(1)), "state": "", "node_guid": guid}
            continue
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "Node GUID":
            guid = value
        if cur is not None:
            _set_field(cur, _IBSTAT_FIELDS, key, value)
    if cur:
        out.ports.append(IbPort(**cur))
    return _note_gaps(out)


# Port fields as each tool names them: the IbPort field and how its value is read.
_IBSTAT_FIELDS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "State": ("state", state_word), "Physical state": ("phys_state", state_word),
    "Rate": ("rate_gbps", _float), "Link layer": ("link_layer", str), "Base lid": ("lid", _int),
    "SM lid": ("sm_lid", _int), "Port GUID": ("port_guid", str)}
_IBSTATUS_FIELDS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "state": ("state", state_word), "phys state": ("phys_state", state_word),
    "rate": ("rate_gbps", _float), "link_layer": ("link_layer", str), "base lid": ("lid", _int),
    "sm lid": ("sm_lid", _int), "default gid": ("gids", lambda v: {0: v})}


def _set_field(cur: dict[str, Any], fields: dict[str, tuple[str, Callable[[str], Any]]], key: str,
               value: str) -> None:
    if key in fields:
        name, read = fields[key]
        cur[name] = read(value)


def read_ibstatus(text: str) -> RdmaRead:
    """``Infiniband device 'mlx5_0' port 1 status:`` blocks (state ``4: ACTIVE``, rate ``200 Gb/sec``)."""
    out = RdmaRead()
    cur: dict | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if re.match(r"Fatal error:\s+device '[^']*'", line):
            out.errors.append(line)  # ibstatus found no device (or port) files in sysfs
            continue
        m = re.match(r"Infiniband device '([^']+)' port (\d+) status:", line)
        if m:
            if cur:
                out.ports.append(IbPort(**cur))
            out.devices.append(m.group(1))
            cur = {"device": m.group(1), "port": int(m.group(2)), "state": "", "gids": {}}
            continue
        if cur is None:
            continue
        key, _, value = line.partition(":")
        _set_field(cur, _IBSTATUS_FIELDS, key.strip(), value.strip())
    if cur:
        out.ports.append(IbPort(**cur))
    return _note_gaps(out)


def read_rdma_link(text: str) -> RdmaRead:
    """iproute2 ``rdma link [show]``: ``link mlx5_0/1 subnet_prefix … lid 3 sm_lid 1 lmc 0 state
    ACTIVE physical_state LINK_UP netdev enp97s0f0``."""
    out = RdmaRead()
    for raw in text.splitlines():
        line = raw.strip()
        m = re.match(r"link (\S+)/(\d+)\s+(.*)$", line)
        if not m:
            continue
        words = m.group(3).split()
        kv = dict(zip(words[::2], words[1::2]))
        out.devices.append(m.group(1))
        out.ports.append(IbPort(m.group(1), int(m.group(2)), state_word(kv.get("state", "")),
                                state_word(kv.get("physical_state", "")),
                                "InfiniBand" if "lid" in kv else ("Ethernet" if "netdev" in kv
                                                                  else ""),
                                lid=_int(kv.get("lid", "")), sm_lid=_int(kv.get("sm_lid", ""))))
    return out


def read_device_list(text: str) -> list[tuple[str, str]]:
    """``ibv_devices`` (device, node GUID) or ``ibv_devinfo -l`` (device, '') rows."""
    rows: list[tuple[str, str]] = []
    listing = re.search(r"^\s*\d+ HCAs? found:", text, re.M)
    for raw in text.splitlines():
        parts = raw.split()
        if listing and len(parts) == 1 and re.fullmatch(r"[\w.-]+", parts[0]):
            rows.append((parts[0], ""))
        elif len(parts) == 2 and re.fullmatch(r"[0-9a-fA-F]{16}", parts[1]):
            rows.append((parts[0], parts[1]))
    return rows


def merge(first: IbPort, second: IbPort) -> IbPort:
    """``first`` with its empty fields filled from ``second`` (same device and port)."""
    fill = {k: getattr(second, k) for k in ("state", "phys_state", "link_layer", "rate_gbps",
                                            "active_mtu", "max_mtu", "lid", "sm_lid",
                                            "node_guid", "port_guid")
            if getattr(first, k) in (None, "") and getattr(second, k) not in (None, "")}
    return replace(first, **fill)
