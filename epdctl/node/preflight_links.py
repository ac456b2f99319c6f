"""The link half of the check agent: `serve` a transfer endpoint and `send` to one (ZMQ or
Mooncake), measuring round trips and throughput from the source address the topology names.
Run through `python -m epdctl.node.preflight_agent serve|send` (see that module's usage).
"""

from __future__ import annotations

import ipaddress
import json
import os
import statistics
import time
from typing import Any

from epdctl.node.probe_io import emit, run_tool

CHUNK = 1 << 20


def _owner(ip: str) -> tuple[str | None, str]:
    """The interface whose address is ``ip`` (127.0.0.2 belongs to lo's 127.0.0.1/8), and its
    operational state."""
    r = run_tool(("ip", "-j", "addr"))
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
    r = run_tool(("ip", "-j", "route", "get", dst, "from", src))
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
        emit({"ready": False, "error": f"cannot listen on {host}:{port}: {e}"})
        return 2
    hello: dict[str, Any] = {"transport": transport}
    engine = None
    if transport == "mooncake":
        try:
            engine, hello["session"], hello["addr"], hello["size"] = _mooncake_target(
                host, buffer_mb, protocol, device)
        except Exception as e:  # noqa: BLE001 - reported to the controller as a reason
            emit({"ready": False, "error": f"mooncake transfer engine on {host}: {e}"})
            return 2
    emit({"ready": True, "pid": os.getpid(), "endpoint": f"{host}:{port}", **hello})
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
