"""The agent that `epdctl check` (and `init`) runs on every node: facts here; serve and send in preflight_links.

    python -m epdctl.node.preflight_agent facts [--model-path DIR]
    python -m epdctl.node.preflight_agent serve --host IP --port P [--transport zmq|mooncake]
    python -m epdctl.node.preflight_agent send  --to IP:P --src IP [--seconds 0.5] [--transport ...]

Why a separate small program: it must run on the nodes themselves (over SSH, in a SLURM step,
inside a network namespace) and measure with the same transport the workers will use, from the
NIC the topology names. Every mode prints exactly one JSON document on stdout (``serve`` prints
one "ready" line first) and never a traceback, so the controller can parse whatever happens.
Imports only the standard library at module level; zmq/mooncake are imported when needed.
"""

from __future__ import annotations

import argparse
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from epdctl.node import sysfs_rdma  # standard library only, like this module
from epdctl.node.probe_io import emit, run_tool

# (probe name, argv) run by `facts`; a missing tool is recorded as rc 127, not an error.
PROBES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ibv_devinfo", ("ibv_devinfo", "-v")),
    ("ibstat", ("ibstat",)),
    ("nvidia_smi", ("nvidia-smi", "--query-gpu=index,name,uuid,memory.total", "--format=csv")),
    ("nvidia_smi_health", ("nvidia-smi", "--query-gpu=index,name,uuid,memory.total,pstate,"
                           "ecc.errors.uncorrected.volatile.total,remapped_rows.pending,"
                           "remapped_rows.failure", "--format=csv")),
    ("nvidia_smi_L", ("nvidia-smi", "-L")),
    ("lsmod", ("lsmod",)),
    ("ib_write_bw", ("ib_write_bw", "--version")),     # is perftest installed (for --links)
    ("ulimit_l", ("sh", "-c", "ulimit -l")),
    ("ip_addr", ("ip", "-j", "addr")),
    ("ss", ("ss", "-ltn")),
    ("net_speed", ("sh", "-c", "grep -H . /sys/class/net/*/speed 2>/dev/null; true")),  # Mb/s, for init
)
# version key -> distributions that provide it (the first one installed wins)
VERSION_PACKAGES: dict[str, tuple[str, ...]] = {
    "epdctl": ("epdctl",), "sglang": ("sglang",), "vllm": ("vllm",), "pyzmq": ("pyzmq",),
    "torch": ("torch",), "transformers": ("transformers",),
    "mooncake": ("mooncake-transfer-engine", "mooncake-transfer-engine-non-cuda"),
}

def _read(path: str) -> dict[str, Any]:
    try:
        return {"rc": 0, "out": Path(path).read_text()}
    except OSError as e:
        return {"rc": 1, "out": "", "err": f"{path}: {e.strerror}"}


def facts(model_path: str | None) -> dict[str, Any]:
    """Raw tool outputs and versions; interpretation happens on the controller."""
    probes = {name: run_tool(argv) for name, argv in PROBES}
    if probes["lsmod"]["rc"] == 127:
        probes["lsmod"] = _read("/proc/modules")
    probes["uname_r"] = {"rc": 0, "out": platform.release()}
    probes["ibstatus"] = sysfs_rdma.probe(sysfs_rdma.ibstatus_text)
    probes["ibdev2netdev"] = sysfs_rdma.probe(sysfs_rdma.ibdev2netdev_text)
    probes["gid_table"] = sysfs_rdma.probe(sysfs_rdma.gid_table_text)
    probes["nvidia_driver"] = _read("/proc/driver/nvidia/version")
    path = Path(model_path) if model_path else Path("/")
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    probes["df"] = run_tool(("df", "-Pk", str(probe)))
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for key, dists in VERSION_PACKAGES.items():
        for dist in dists:
            try:
                versions[key] = f"{metadata.version(dist)} ({dist})"
                break
            except metadata.PackageNotFoundError:
                continue
    exists = {model_path: path.exists()} if model_path else {}
    return {"probes": probes, "versions": versions, "path_exists": exists,
            "hostname": platform.node()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m epdctl.node.preflight_agent")
    sub = ap.add_subparsers(dest="mode", required=True)
    f = sub.add_parser("facts")
    f.add_argument("--model-path")
    s = sub.add_parser("serve")
    s.add_argument("--host", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--transport", choices=("zmq", "mooncake"), default="zmq")
    s.add_argument("--idle-timeout", type=float, default=30.0)
    s.add_argument("--buffer-mb", type=int, default=16)
    s.add_argument("--protocol", choices=("tcp", "rdma"), default="tcp")
    s.add_argument("--device", default="")
    c = sub.add_parser("send")
    c.add_argument("--to", required=True)
    c.add_argument("--src", required=True)
    c.add_argument("--transport", choices=("zmq", "mooncake"), default="zmq")
    c.add_argument("--seconds", type=float, default=0.5)
    c.add_argument("--connect-timeout", type=float, default=3.0)
    c.add_argument("--pings", type=int, default=20)
    c.add_argument("--window", type=int, default=8)
    c.add_argument("--protocol", choices=("tcp", "rdma"), default="tcp")
    c.add_argument("--device", default="")
    a = ap.parse_args(argv)
    try:
        if a.mode == "facts":
            emit(facts(a.model_path))
            return 0
        from epdctl.node import preflight_links  # the link probes need pyzmq (and Mooncake)

        if a.mode == "serve":
            return preflight_links.serve(a.host, a.port, a.transport, a.idle_timeout, a.buffer_mb,
                                         a.protocol, a.device)
        emit(preflight_links.send(a.to, a.src, a.seconds, a.transport, a.connect_timeout, a.pings,
                                  a.window, a.protocol, a.device))
        return 0
    except Exception as e:  # noqa: BLE001 - the controller needs one JSON line, not a traceback
        emit({"ok": False, "ready": False, "reason": f"agent error: {type(e).__name__}: {e}"})
        return 1


if __name__ == "__main__":
    sys.exit(main())
