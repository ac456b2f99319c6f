"""The link agent that `epdctl check` runs on every node: facts, serve, send.

    python -m epdctl.preflight.agent facts [--model-path DIR]
    python -m epdctl.preflight.agent serve --host IP --port P [--transport zmq|mooncake]
    python -m epdctl.preflight.agent send  --to IP:P --src IP [--seconds 0.5] [--transport ...]

Why a separate small program: it must run on the nodes themselves (over SSH, in a SLURM step,
inside a network namespace) and measure with the same transport the workers will use, from the
NIC the topology names. Every mode prints exactly one JSON document on stdout (``serve`` prints
one "ready" line first) and never a traceback, so the controller can parse whatever happens.
Imports only the standard library at module level; zmq/mooncake are imported when needed.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from epdctl.preflight import sysfs_rdma  # standard library only, like this module

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
CHUNK = 1 << 20


def _emit(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def _run(argv: tuple[str, ...], timeout: float = 15.0) -> dict[str, Any]:
    if shutil.which(argv[0]) is None:
        return {"rc": 127, "out": "", "err": f"{argv[0]}: command not found"}
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"rc": 124, "out": "", "err": f"{' '.join(argv)} timed out after {timeout:g}s"}
    return {"rc": p.returncode, "out": p.stdout, "err": p.stderr}


def _read(path: str) -> dict[str, Any]:
    try:
        return {"rc": 0, "out": Path(path).read_text()}
    except OSError as e:
        return {"rc": 1, "out": "", "err": f"{path}: {e.strerror}"}


def facts(model_path: str | None) -> dict[str, Any]:
    """Raw tool outputs and versions; interpretation happens on the controller."""
    probes = {name: _run(argv) for name, argv in PROBES}
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
    probes["df"] = _run(("df", "-Pk", str(probe)))
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


def _owner(ip: str) -> tuple[str | None, str]:
    """The interface whose address is ``ip`` (127.0.0.2 belongs to lo's 127.0.0.1/8), and its
    operational state."""
    r = _run(("ip", "-j", "addr"))
    if r["rc"] != 0:
        return None, ""
    addr = ipaddress.ip_address(ip)
    for it in json.loads(r["out"] or "[]"):
        for a in it.get("addr_info", []):
            net = ipaddress.ip_network(f"{a['local']}/{a.get('prefixlen', 32)}", strict=False)
            if addr == ipaddress.ip_address(a["local"]) or (
                    it.get("ifname") == "lo" and addr in net):
                return it["ifname"], str(it.get("operstate", ""))
    return None, ""


def _egress(dst: str, src: str) -> tuple[str | None, str | None]:
    """(device the kernel routes ``dst`` through from ``src``, error when there is no route)."""
    r = _run(("ip", "-j", "route", "get", dst, "from", src))
    if r["rc"] == 127:
        return None, None
    if r["rc"] != 0:
        return None, (r["err"].strip().splitlines() or ["no route"])[-1]
    routes = json.loads(r["out"] or "[]")
    return (routes[0].get("dev") if routes else None), None


def serve(host: str, port: int, transport: str, idle: float, buffer_mb: int,
          protocol: str = "tcp", device: str = "") -> int:
    import zmq

    ctx: zmq.Context = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.bind(f"tcp://{host}:{port}")
    except zmq.ZMQError as e:
        _emit({"ready": False, "error": f"cannot listen on {host}:{port}: {e}"})
        return 2
    hello: dict[str, Any] = {"transport": transport}
    engine = None
    if transport == "mooncake":
        try:
            engine, hello["session"], hello["addr"], hello["size"] = _mooncake_target(
                host, buffer_mb, protocol, device)
        except Exception as e:  # noqa: BLE001 - reported to the controller as a reason
            _emit({"ready": False, "error": f"mooncake transfer engine on {host}: {e}"})
            return 2
    _emit({"ready": True, "pid": os.getpid(), "endpoint": f"{host}:{port}", **hello})
    received = 0
    last = time.monotonic()
    while time.monotonic() - last < idle:
        if not sock.poll(200):
            continue
        frames = sock.recv_multipart(copy=False)
        last = time.monotonic()
        ident, kind = frames[0].bytes, frames[1].bytes
        if kind == b"hello":
            peer = frames[1].get("Peer-Address")
            sock.send_multipart([ident, b"hello", json.dumps({**hello, "peer": peer}).encode()])
        elif kind == b"ping":
            sock.send_multipart([ident, b"pong"])
        elif kind == b"data":
            received += len(frames[2].buffer)
            sock.send_multipart([ident, b"ack"])
        elif kind == b"stop":
            sock.send_multipart([ident, b"bye", str(received).encode()])
            break
    sock.close()
    return 0


def _mooncake_target(host: str, buffer_mb: int, protocol: str, device: str
                     ) -> tuple[Any, str, int, int]:
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    if engine.initialize(host, "P2PHANDSHAKE", protocol, device) != 0:
        raise RuntimeError(f"initialize({host}, {protocol}, {device or 'auto'}) failed")
    size = buffer_mb << 20
    addr = engine.allocate_managed_buffer(size)
    if not addr:
        raise RuntimeError(f"cannot allocate a {buffer_mb} MiB buffer")
    return engine, f"{host}:{engine.get_rpc_port()}", addr, size


def send(to: str, src: str, seconds: float, transport: str, connect_timeout: float,
         pings: int, window: int, protocol: str = "tcp", device: str = "") -> dict[str, Any]:
    host, _, port = to.rpartition(":")
    result: dict[str, Any] = {"ok": False, "to": to, "src": src, "transport": transport}
    (src_dev, state), (egress, no_route) = _owner(src), _egress(host, src)
    result.update(src_dev=src_dev, egress_dev=egress)
    if src_dev is None:
        return {**result, "reason": f"wrong NIC: {src} is not an address of this node"}
    if state == "DOWN":
        return {**result, "reason": f"unreachable: {src_dev} ({src}) is DOWN on the sending node"}
    if no_route:
        return {**result, "reason": f"unreachable: no route from {src} to {host} ({no_route})"}
    if egress is not None and egress != src_dev:
        return {**result, "reason": f"wrong NIC: traffic to {host} leaves through {egress}, "
                                    f"not through {src_dev} ({src})"}
    import zmq

    ctx: zmq.Context = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://{src}:0;{host}:{port}")
    try:
        sock.send_multipart([b"hello"])
        if not sock.poll(int(connect_timeout * 1000)):
            return {**result, "reason": f"unreachable: no answer from {to} within "
                                        f"{connect_timeout:g} s (link down, route or firewall)"}
        info = json.loads(sock.recv_multipart()[1])
        result["peer_seen"] = info.get("peer")
        rtts = []
        for _ in range(pings):
            t0 = time.perf_counter()
            sock.send_multipart([b"ping"])
            if not sock.poll(int(connect_timeout * 1000)):
                return {**result, "reason": f"unreachable: {to} stopped answering pings"}
            sock.recv_multipart()
            rtts.append((time.perf_counter() - t0) * 1000)
        result["rtt_ms"] = round(statistics.median(rtts), 3)
        if transport == "mooncake":
            moved, elapsed = _mooncake_send(info, src, seconds, protocol, device)
        else:
            moved, elapsed = _zmq_send(sock, seconds, window, connect_timeout)
        if moved is None:
            return {**result, "reason": f"stalled: {to} stopped acknowledging data"}
        sock.send_multipart([b"stop"])
        sock.poll(int(connect_timeout * 1000))
        gbps = moved * 8 / elapsed / 1e9 if elapsed > 0 else 0.0
        return {**result, "ok": True, "bytes": moved, "seconds": round(elapsed, 4),
                "gbps": round(gbps, 4), "reason": None}
    finally:
        sock.close()


def _zmq_send(sock: Any, seconds: float, window: int, timeout: float) -> tuple[int | None, float]:
    payload = os.urandom(CHUNK)
    outstanding = acked = 0
    t0 = time.perf_counter()
    t_last = t0
    while True:
        sending = time.perf_counter() - t0 < seconds
        while sending and outstanding < window:
            sock.send_multipart([b"data", payload], copy=False)
            outstanding += 1
        if not outstanding:
            break
        if not sock.poll(int(timeout * 1000)):
            return None, 0.0
        sock.recv_multipart()
        outstanding -= 1
        acked += CHUNK
        t_last = time.perf_counter()
    return acked, t_last - t0


def _mooncake_send(info: dict[str, Any], src: str, seconds: float, protocol: str, device: str
                   ) -> tuple[int | None, float]:
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    if engine.initialize(src, "P2PHANDSHAKE", protocol, device) != 0:
        raise RuntimeError(f"mooncake initialize({src}, {protocol}, {device or 'auto'}) failed")
    size = min(int(info["size"]), 16 * CHUNK)
    local = engine.allocate_managed_buffer(size)
    moved = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        if engine.transfer_sync_write(info["session"], local, int(info["addr"]), size) != 0:
            return None, 0.0
        moved += size
    return moved, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m epdctl.preflight.agent")
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
            _emit(facts(a.model_path))
            return 0
        if a.mode == "serve":
            return serve(a.host, a.port, a.transport, a.idle_timeout, a.buffer_mb, a.protocol,
                         a.device)
        _emit(send(a.to, a.src, a.seconds, a.transport, a.connect_timeout, a.pings, a.window,
                   a.protocol, a.device))
        return 0
    except Exception as e:  # noqa: BLE001 - the controller needs one JSON line, not a traceback
        _emit({"ok": False, "ready": False, "reason": f"agent error: {type(e).__name__}: {e}"})
        return 1


if __name__ == "__main__":
    sys.exit(main())
