"""The references bench_transfer.py sets our transports beside: a memcpy of the same tensors,
the checksum candidates, iperf3 over loopback, and a bare pyzmq ROUTER / DEALER round trip.

Measured, not asserted; bench_transfer.py runs them in the same minutes as our transports.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import threading
import time
import zlib
from typing import Callable

import numpy as np
import torch
import xxhash
import zmq

RAW_PORT, IPERF_PORT = 33403, 33404
MiB = 2**20


def memcpy(tensors: dict[str, torch.Tensor]) -> Callable[[], object]:
    """The baseline: copy each tensor into its own preallocated destination, reused every call
    (numpy: one thread, like our copies; torch's may spin OpenMP). Rotating two or three sets of
    destinations, as the same-host path rotates its segments, measured within noise (16 MiB
    best 0.47-0.54 ms either way), so one set is kept."""
    src = [t.contiguous().view(-1).view(torch.uint8).numpy() for t in tensors.values()]
    dst = [np.empty_like(a) for a in src]
    return lambda: [np.copyto(d, a) for d, a in zip(dst, src)]


def best_and_median(fn, reps: int) -> tuple[float, float]:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def checksums() -> dict[str, float]:
    """GB/s of each checksum candidate (and a memcpy) over 16 MiB."""
    buf = np.random.default_rng(0).integers(0, 255, 16 * MiB, dtype=np.uint8)
    mv, dst = memoryview(buf), np.empty_like(buf)
    cands = {"memcpy": lambda: np.copyto(dst, buf), "zlib.crc32": lambda: zlib.crc32(mv),
             "xxh3_64 (xxhash)": lambda: xxhash.xxh3_64_intdigest(mv)}
    try:
        import crc32c
        cands["crc32c (hardware CRC32C)"] = lambda: crc32c.crc32c(mv)
    except ImportError:
        pass
    try:
        import google_crc32c
        frozen = bytes(mv)  # its C API takes read-only bytes only
        cands["google-crc32c"] = lambda: google_crc32c.value(frozen)
    except ImportError:
        pass
    return {name: buf.nbytes / best_and_median(fn, 10)[0] / 1e9 for name, fn in cands.items()}


def iperf3() -> float | None:
    """Loopback TCP GB/s measured by iperf3 (None if it is not installed)."""
    exe = shutil.which("iperf3")
    if exe is None:
        return None
    server = subprocess.Popen([exe, "-s", "-1", "-p", str(IPERF_PORT), "-B", "127.0.0.1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            out = subprocess.run([exe, "-c", "127.0.0.1", "-p", str(IPERF_PORT), "-t", "2", "-J"],
                                 capture_output=True, text=True)
            try:
                return json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"] / 8 / 1e9
            except (ValueError, KeyError):  # the server was not listening yet
                time.sleep(0.2)
        return None
    finally:
        server.kill()
        server.wait()


def raw_server(stop: threading.Event) -> None:
    """A bare pyzmq ROUTER: take each multipart message (copy=False) and answer one frame."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(f"tcp://127.0.0.1:{RAW_PORT}")
    while not stop.is_set():
        if sock.poll(200):
            msg = sock.recv_multipart(copy=False)
            sock.send_multipart([msg[0], b"OK"])
    sock.close(linger=0)
    ctx.term()


def raw_send(sock: zmq.Socket, frames: list) -> None:
    sock.send_multipart(frames, copy=False)
    sock.recv()
