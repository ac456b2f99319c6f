"""Judge Mooncake transfer-engine logs (``transfer_engine_bench``, or the engine inside SGLang /
vLLM / the link agent): glog lines from its source files, with causes for its known errors.

Mooncake logs ``RDMA device: mlx5_0, LID: 0, GID: (GID_Index 3) ...`` per NIC it opened; those
are read as facts. Its error lines are quoted with advice.
"""

from __future__ import annotations

import re

from epdctl.preflight.judgement import FAIL, PASS, WARN, Judgement
from epdctl.preflight.rdma_netdev import GID_ENV

# glog: I0331 12:02:38.332201 56056 file.cpp:125] msg   (newer builds: I20251205 03:33:19...)
GLOG = re.compile(r"^([IWEF])(\d{4}|\d{8})\s+[\d:.]+\s+\d+\s+([\w./-]+\.(?:cpp|cc|h)):\d+\]\s?(.*)$")
MOONCAKE_FILES = ("transfer_engine", "rdma_context", "rdma_endpoint", "rdma_transport", "topology",
                  "tcp_transport", "transfer_metadata", "client_service", "client.cpp",
                  "transfer_task", "worker_pool", "config.cpp", "ha_helper", "store_py")

_CAUSES: tuple[tuple[str, str, str], ...] = (
    ("Failed to modify QP to RTR", FAIL,
     "the two ends could not connect their QPs: use a RoCE v2 GID of the same family on both ends "
     f"({GID_ENV}; pick it with show_gids), the same MTU (MC_MTU), and check routing/VLAN between "
     "the NICs; on InfiniBand check the subnet manager"),
    ("Failed to modify QP to INIT", FAIL, "the local port is not usable: check its state (ibstat) "
     "and the GID index"),
    ("Failed to register memory", FAIL, "memory registration failed: raise the locked-memory limit "
     "to unlimited (limits.conf / LimitMEMLOCK=infinity; containers: --ulimit memlock=-1) and check "
     "GPUDirect (nvidia_peermem) for GPU memory"),
    ("No IB devices found", FAIL, "the engine found no RDMA device: load the driver, pass "
     "/dev/infiniband into the container, or run with protocol tcp on purpose"),
    ("Skipping unavailable device", FAIL, "a NIC is listed in sysfs but its /dev/infiniband node "
     "is missing: in containers pass --device=/dev/infiniband (uverbs*), or set the device list"),
    ("does not exist", WARN, "a device path is missing; see the 'Skipping unavailable device' lines"),
    ("Session::readBody failed", FAIL, "the TCP transport lost its peer mid-transfer: check that "
     "the peer process is alive and reachable (firewall, segment/metadata address)"),
    ("Failed to select remote NIC", FAIL, "the peer registered no NIC that reaches this buffer's "
     "location: give both ends matching device lists"),
    ("Failed to complete transfers", FAIL, "transfers timed out: the link stalls (see RTR/handshake "
     "errors above, or a slow/TCP path)"),
    ("NotSupportedTransport", FAIL, "the two ends use different protocols (rdma vs tcp): use the "
     "same protocol on both"),
    ("Failed to get segment descriptor", FAIL, "the peer's metadata is not registered: the peer "
     "is down or uses another metadata server / engine version"),
    ("Local segment descriptor not found", FAIL, "the engine was not initialised for this "
     "protocol; check protocol and device settings"),
)


# ibv_reg_mr errno (as Mooncake prints it, "...: Cannot allocate memory [12]") -> the cause
REG_MR_ERRNO = {
    12: "ENOMEM: the locked-memory limit (or the HCA's MR resources) is exhausted: make memlock "
        "unlimited (limits.conf, LimitMEMLOCK=infinity, containers --ulimit memlock=-1:-1) or "
        "register a smaller segment",
    14: "EFAULT: the NIC cannot map this memory, typically GPU memory without GPUDirect: load "
        "nvidia_peermem (or use the open kernel module's dma-buf on Linux >= 5.12), or use host "
        "memory for the buffer",
    34: "ERANGE: the region is larger than the device can register (ibv_devinfo -v max_mr_size): "
        "register a smaller segment or several",
    22: "EINVAL: the device refused the region's address/access flags: check the buffer "
        "(host vs GPU) and the device",
}


def is_mooncake_line(line: str) -> bool:
    m = GLOG.match(line.strip())
    return m is not None and any(f in m.group(3) for f in MOONCAKE_FILES)


# transfer_engine_bench.cpp: "Test completed: duration 10.01, batch count 4895, throughput 0.26 GB/s"
# (older builds print the number without its unit; calculateRate's unit is GB/s)
_RESULT = re.compile(r"Test completed: duration ([\d.]+)(?:us)?,.*?throughput ([\d.]+)\s*(GB/s|MB/s|Gbps|KB/s)?")
_TO_GBPS = {"GB/s": 8.0, "MB/s": 8e-3, "KB/s": 8e-6, "Gbps": 1.0}
# the slowest RDMA port epdctl's topologies declare (25 GbE RoCE); a bench below it is not an RDMA result
MIN_RDMA_GBPS = 25.0


def is_bench(text: str, commands: tuple[str, ...] = ()) -> bool:
    return "transfer_engine_bench" in text or any("transfer_engine_bench" in c for c in commands)


def judge_mooncake(text: str, line_rate_gbps: float | None = None) -> Judgement:
    """``line_rate_gbps``: the rate of the NICs the topology will use (``epdctl check``); without
    it a bench is judged against the slowest RDMA port a topology declares."""
    bench = is_bench(text)
    j = Judgement("transfer_engine_bench" if bench else "mooncake", family="mooncake")
    devices: dict[str, int] = {}
    tcp = False
    errors = 0
    seen: set[str] = set()
    for raw in text.splitlines():
        m = GLOG.match(raw.strip())
        if not m:
            continue
        sev, src, msg = m.group(1), m.group(3), m.group(4)
        d = re.search(r"RDMA device: ([^,\s]+), LID: (\d+), GID: \(GID_Index (\d+)\) (\S+)", msg)
        if d:
            devices[d.group(1)] = int(d.group(3))
            if d.group(2) == "0" and d.group(4).startswith("fe:80") and d.group(1) not in seen:
                seen.add(d.group(1))
                j.add(WARN, f"{d.group(1)} (RoCE, LID 0) uses link-local GID index {d.group(3)}",
                      f"a link-local GID does not route between subnets: use the RoCE v2 IPv4 "
                      f"index from show_gids on both ends ({GID_ENV})")
        if "tcp_transport" in src:
            tcp = True
        for needle, level, advice in _CAUSES:
            if needle in msg:
                if needle == "Failed to register memory":
                    e = re.search(r"\[(\d+)\]\s*\S*$", msg)
                    advice = REG_MR_ERRNO.get(int(e.group(1)), advice) if e else advice
                if needle not in seen:
                    seen.add(needle)
                    j.add(level, f"{sev}: {src}: {msg.strip()[:240]}", advice)
                errors += level == FAIL
                break
        else:
            if sev in "EF":
                errors += 1
                if msg not in seen:
                    seen.add(msg)
                    j.add(FAIL, f"{src}: {msg.strip()[:240]}",
                          "an engine error not known to epdctl: read the line above")
    if re.search(r"--protocol[= ]tcp\b", text):
        tcp = True
    j.facts.update(devices=devices, gid_index=sorted(set(devices.values())), tcp=tcp,
                   error_lines=errors)
    if bench:
        _judge_result(j, text, devices, tcp, line_rate_gbps)
    gids = set(devices.values())
    if len(gids) > 1:
        j.add(WARN, f"NICs use different GID indexes {sorted(gids)}", f"pin one with {GID_ENV}")
    if tcp and not devices and not errors and "throughput_gbps" not in j.facts:
        j.add(WARN, "the engine runs over TCP: no RDMA device in use",
              "if RDMA was intended, set protocol rdma and the device list (or fix the RDMA "
              "errors); TCP moves KV/embeddings far slower")
    if not j.findings:
        j.add(PASS, f"engine started{': ' + ', '.join(sorted(devices)) if devices else ''}; "
                    f"no error in the text")
    return j


def _judge_result(j: Judgement, text: str, devices: dict[str, int], tcp: bool,
                  line_rate_gbps: float | None) -> None:
    """A finished bench is a measurement: judge its rate against the line rate it should reach."""
    m = None
    for m in _RESULT.finditer(text):
        pass
    if m is None:
        return
    unit = m.group(3) or "GB/s"
    gbps = float(m.group(2)) * _TO_GBPS[unit]
    j.facts.update(throughput_gbps=round(gbps, 3), throughput=f"{m.group(2)} {unit}",
                   unit_assumed=m.group(3) is None)
    over = "TCP" if tcp or not devices else f"RDMA ({', '.join(sorted(devices))})"
    want = line_rate_gbps or MIN_RDMA_GBPS
    what = (f"the line rate of the NICs the topology uses ({want:g} Gb/s)" if line_rate_gbps
            else f"the slowest RDMA port a topology declares ({want:g} Gb/s)")
    frac = gbps / want
    said = f"transfer_engine_bench moved {m.group(2)} {unit} = {gbps:.3g} Gb/s over {over}: {frac:.0%} of {what}"
    if over == "TCP":
        j.add(FAIL, said + "; a TCP run measures the fallback path, not the RDMA path KV transfer uses",
              "run the bench with --protocol rdma --device_name <the topology's NICs> on both ends "
              "(no RDMA device opened means the driver, /dev/infiniband or the device list is missing); "
              "if TCP is intended, set transfer.rdma: off and expect this rate")
    elif frac < 0.5:
        j.add(FAIL, said, "below half the line rate: check the NICs' rates and PCIe/NUMA placement "
                          "(ibstat, mlxlink), raise --threads/--batch_size/--block_size, and compare "
                          "with ib_write_bw between the same NICs")
    else:
        j.add(PASS, said)
