"""Pure parsers for the text that node tools print (RDMA, GPU, kernel, limits, disk, network).

Why pure functions over captured text: the checks must be testable against recorded outputs of
real machines (tests/fixtures/preflight/), and this machine has neither RDMA devices nor GPUs.
Every parser tolerates the variations seen in the wild (tabs vs spaces, ``ibv_devinfo`` with
and without ``-v``, ``nvidia-smi`` csv with units) and raises ``ValueError`` on text it cannot
read, so a caller can report "unreadable output" rather than a wrong fact.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field

# IB speeds per lane in Gbit/s as ibv_devinfo -v prints them (``active_speed: 25.0 Gbps (32)``).
_WIDTH_LANES = {"1X": 1, "2X": 2, "4X": 4, "8X": 8, "12X": 12}


@dataclass(frozen=True)
class IbPort:
    """One port of an RDMA device, as ``ibv_devinfo`` or ``ibstat`` describe it."""

    device: str
    port: int
    state: str                      # ACTIVE | DOWN | INIT | ARMED | POLLING ... (upper case)
    phys_state: str = ""            # LINKUP | POLLING | DISABLED ... ('' when not printed)
    link_layer: str = ""            # InfiniBand | Ethernet | '' (old ibv_devinfo omits it)
    rate_gbps: float | None = None  # ibstat "Rate", or width x speed from ibv_devinfo -v
    active_mtu: int | None = None
    max_mtu: int | None = None
    gids: dict[int, str] = field(default_factory=dict)
    gid_types: dict[int, str] = field(default_factory=dict)   # index -> "RoCE v2" / "RoCE v1" / "IB"


def _state_word(value: str) -> str:
    """``PORT_ACTIVE (4)`` / ``Active`` / ``4: ACTIVE`` -> ``ACTIVE``."""
    v = re.sub(r"\(\d+\)", "", value).strip()
    v = v.split(":", 1)[-1].strip()
    v = v.upper().removeprefix("PORT_")
    return v


def parse_ibv_devinfo(text: str) -> list[IbPort]:
    """Ports from ``ibv_devinfo`` (plain or ``-v``): state, link layer, MTU, GIDs, rate."""
    ports: list[IbPort] = []
    device: str | None = None
    cur: dict | None = None

    def flush() -> None:
        if cur is not None:
            width, speed = cur.pop("width", None), cur.pop("speed", None)
            if cur.get("rate_gbps") is None and width and speed is not None:
                cur["rate_gbps"] = _WIDTH_LANES.get(width, 0) * speed
            ports.append(IbPort(**cur))

    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("hca_id:"):
            flush()
            cur = None
            device = line.split(":", 1)[1].strip()
            continue
        m = re.match(r"port:\s*(\d+)$", line)
        if m and device is not None:
            flush()
            cur = {"device": device, "port": int(m.group(1)), "state": "", "gids": {},
                   "gid_types": {}}
            continue
        if cur is None:
            continue
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "state":
            cur["state"] = _state_word(value)
        elif key == "phys_state":
            cur["phys_state"] = _state_word(value)
        elif key == "link_layer":
            cur["link_layer"] = value
        elif key in ("active_mtu", "max_mtu"):
            cur[key] = int(value.split()[0])
        elif key == "active_width":
            cur["width"] = value.split()[0]
        elif key == "active_speed":
            m2 = re.match(r"([\d.]+)\s*Gbps", value)
            if m2:
                cur["speed"] = float(m2.group(1))
        else:
            m3 = re.match(r"GID\[\s*(\d+)\]", key)
            if m3:
                gid, _, kind = line.split(":", 1)[1].strip().partition(",")
                idx = int(m3.group(1))
                cur["gids"][idx] = gid.strip()
                if kind.strip():
                    cur["gid_types"][idx] = kind.strip()
    flush()
    if not ports and "hca_id" in text:
        raise ValueError("ibv_devinfo output names devices but no ports")
    return ports


def parse_ibstat(text: str) -> list[IbPort]:
    """Ports from ``ibstat``: ``CA 'mlx5_0'`` blocks with State / Physical state / Rate / Link layer."""
    ports: list[IbPort] = []
    device: str | None = None
    cur: dict | None = None
    for raw in text.splitlines():
        line = raw.strip()
        m = re.match(r"CA '([^']+)'", line)
        if m:
            if cur:
                ports.append(IbPort(**cur))
            device, cur = m.group(1), None
            continue
        m = re.match(r"Port (\d+):$", line)
        if m and device is not None:
            if cur:
                ports.append(IbPort(**cur))
            cur = {"device": device, "port": int(m.group(1)), "state": ""}
            continue
        if cur is None:
            continue
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "State":
            cur["state"] = _state_word(value)
        elif key == "Physical state":
            cur["phys_state"] = _state_word(value)
        elif key == "Rate":
            cur["rate_gbps"] = float(value.split()[0])
        elif key == "Link layer":
            cur["link_layer"] = value
    if cur:
        ports.append(IbPort(**cur))
    return ports


@dataclass(frozen=True)
class IbBandwidth:
    """The result line of a perftest run (``ib_write_bw``, ``ib_read_bw``, ``ib_send_bw``)."""

    size_bytes: int
    iterations: int
    peak_gbps: float
    avg_gbps: float
    msg_rate_mpps: float
    device: str = ""
    link_type: str = ""


def parse_ib_write_bw(text: str) -> IbBandwidth:
    """The last result row; MB/sec (perftest's default) is converted to Gbit/s."""
    device = link = ""
    unit: str | None = None
    row: list[str] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        m = re.search(r"Device\s*:\s*(\S+)", line)
        if m:
            device = m.group(1)
        m = re.match(r"Link type\s*:\s*(\S+)", line)
        if m:
            link = m.group(1)
        m = re.search(r"BW average\[(Gb/sec|MB/sec|MiB/sec)\]", line)
        if m:
            unit = m.group(1)
            continue
        parts = line.split()
        if unit and len(parts) >= 5 and parts[0].isdigit() and parts[1].isdigit():
            row = parts
    if unit is None or row is None:
        raise ValueError("no perftest result row (is the peer running, is the device right?)")
    factor = {"Gb/sec": 1.0, "MB/sec": 8e6 / 1e9, "MiB/sec": 8 * 1048576 / 1e9}[unit]
    return IbBandwidth(int(row[0]), int(row[1]), float(row[2]) * factor, float(row[3]) * factor,
                       float(row[4]), device, link)


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str = ""
    memory_mib: int | None = None


def parse_nvidia_smi_csv(text: str) -> list[Gpu]:
    """``nvidia-smi --query-gpu=index,name,uuid,memory.total --format=csv[,noheader]``."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    cols = ["index", "name", "uuid", "memory.total"]
    if lines[0].lower().startswith("index"):
        cols = [c.strip().split(" [")[0] for c in lines[0].split(",")]
        lines = lines[1:]
    gpus = []
    for ln in lines:
        vals = dict(zip(cols, (v.strip() for v in ln.split(","))))
        if "index" not in vals or not vals["index"].isdigit():
            raise ValueError(f"unexpected nvidia-smi csv line: {ln!r}")
        mem = vals.get("memory.total", "")
        m = re.match(r"(\d+)", mem)
        gpus.append(Gpu(int(vals["index"]), vals.get("name", ""), vals.get("uuid", ""),
                        int(m.group(1)) if m else None))
    return gpus


def parse_nvidia_smi_list(text: str) -> list[Gpu]:
    """``nvidia-smi -L``: ``GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)`` (MIG lines skipped)."""
    gpus = []
    for ln in text.splitlines():
        m = re.match(r"GPU (\d+): (.+?) \(UUID: ([^)]+)\)", ln.strip())
        if m:
            gpus.append(Gpu(int(m.group(1)), m.group(2), m.group(3)))
    return gpus


@dataclass(frozen=True)
class KernelModule:
    name: str
    size: int
    use_count: int
    used_by: tuple[str, ...]


def parse_lsmod(text: str) -> dict[str, KernelModule]:
    """``lsmod`` or ``/proc/modules`` (the latter has commas and a state column)."""
    mods: dict[str, KernelModule] = {}
    for ln in text.splitlines():
        parts = ln.split()
        if len(parts) < 3 or parts[0] == "Module" or not parts[1].isdigit():
            continue
        users = parts[3] if len(parts) > 3 else ""
        used_by = tuple(u for u in users.replace(",", " ").split() if u not in ("-", "[permanent]"))
        mods[parts[0]] = KernelModule(parts[0], int(parts[1]), int(parts[2]), used_by)
    return mods


def parse_ulimit_l(text: str) -> int | None:
    """``ulimit -l``: KiB of lockable memory, ``None`` for unlimited."""
    value = text.strip().splitlines()[-1].strip() if text.strip() else ""
    if value == "unlimited":
        return None
    if not value.isdigit():
        raise ValueError(f"unexpected `ulimit -l` output {value!r}")
    return int(value)


@dataclass(frozen=True)
class DiskUsage:
    filesystem: str
    size_kib: int
    used_kib: int
    avail_kib: int
    mount: str


def parse_df(text: str) -> list[DiskUsage]:
    """``df -Pk [PATH]`` (POSIX format: one line per filesystem, sizes in KiB)."""
    out = []
    for ln in text.splitlines()[1:]:
        parts = ln.split()
        if len(parts) >= 6 and parts[1].isdigit():
            out.append(DiskUsage(parts[0], int(parts[1]), int(parts[2]), int(parts[3]),
                                 " ".join(parts[5:])))
    return out


@dataclass(frozen=True)
class NetIface:
    name: str
    state: str                       # UP | DOWN | UNKNOWN (loopback)
    mtu: int | None
    addrs: tuple[str, ...]           # addresses without prefix length
    prefixes: tuple[str, ...] = ()   # the same with prefix length ("127.0.0.1/8"), when known

    def holds(self, ip: str) -> bool:
        """True when ``ip`` is this interface's: one of its addresses, or (loopback) in its net."""
        if ip in self.addrs:
            return True
        if self.name != "lo":
            return False
        try:
            addr = ipaddress.ip_address(ip)
            return any(addr in ipaddress.ip_network(p, strict=False) for p in self.prefixes)
        except ValueError:
            return False


def parse_ip_j_addr(text: str) -> list[NetIface]:
    """``ip -j addr``."""
    out = []
    for it in json.loads(text or "[]"):
        infos = [a for a in it.get("addr_info", []) if "local" in a]
        out.append(NetIface(it["ifname"], it.get("operstate", ""), it.get("mtu"),
                            tuple(a["local"] for a in infos),
                            tuple(f"{a['local']}/{a.get('prefixlen', 128)}" for a in infos)))
    return out


def parse_ip_br_addr(text: str) -> list[NetIface]:
    """``ip -br addr``: ``eth0@if7  UP  10.77.0.1/24 fe80::.../64``."""
    out = []
    for ln in text.splitlines():
        parts = ln.split()
        if len(parts) >= 2:
            name = parts[0].split("@")[0]
            out.append(NetIface(name, parts[1], None, tuple(a.split("/")[0] for a in parts[2:]),
                                tuple(parts[2:])))
    return out


def parse_ss_ltn(text: str) -> set[tuple[str, int]]:
    """Listening TCP sockets from ``ss -ltn`` as (address, port); ``*``/``[::]`` mean any."""
    out: set[tuple[str, int]] = set()
    for ln in text.splitlines():
        parts = ln.split()
        if len(parts) < 4 or parts[0] != "LISTEN":
            continue
        addr, _, port = parts[3].rpartition(":")
        if port.isdigit():
            addr = addr.strip("[]").split("%")[0]
            out.add(("*" if addr in ("*", "0.0.0.0", "::") else addr, int(port)))
    return out
