"""Pure parsers for the text that node tools print (RDMA, GPU, kernel, limits, disk, network).

Why pure functions over captured text: the checks must be testable against recorded outputs of
real machines (tests/fixtures/preflight/), and this machine has neither RDMA devices nor GPUs.
Every parser tolerates the variations seen in the wild (tabs vs spaces, ``ibv_devinfo`` with
and without ``-v``, ``nvidia-smi`` csv with units). The RDMA readers live in ``rdma_text`` and
never raise; the others raise ``ValueError`` on text they cannot read. Judgements (pass, warn,
fail with advice) are made in ``diagnose`` and the ``*_judge`` modules.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass

from epdctl.preflight.rdma_text import IbPort, read_ibstat, read_ibv_devinfo

def parse_ibv_devinfo(text: str) -> list[IbPort]:
    """Ports from ``ibv_devinfo`` (plain or ``-v``); see ``rdma_text.read_ibv_devinfo``."""
    return read_ibv_devinfo(text).ports


def parse_ibstat(text: str) -> list[IbPort]:
    """Ports from ``ibstat``; see ``rdma_text.read_ibstat``."""
    return read_ibstat(text).ports


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
