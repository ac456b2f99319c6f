"""The sender's half of a checked hand-off, in one process: copy a KV message into a wire buffer
and checksum it, as the transports do (``transports/spans.write_span``, parts of ~2 MiB).

Measured, not asserted. Side by side in one run, rounds alternated so the host's load hits
each alike: numpy copy then xxhash per cached piece (the fallback), the fused C loop
(``native_copy.py``: each stripe read once, stored and hashed), a plain numpy memcpy of the
same tensors into the same buffer (no checksum), and the receiver's check of the written parts
(``spans.span_sum``, xxhash). Best and median of the repetitions, ms.

``--handoff shm|tcp``: whole hand-offs between two processes (the runtime's ZMQ transport, same-
host shared memory or tcp), the sender switching the C loop on and off send by send (its
receiver checks with xxhash either way): an A/B in one run, each send beside the others' neighbours, so a host
whose load changes minute to minute hits every variant alike. It times bench_transfer.py's memcpy
baseline (same tensors, reused destinations) back to back before the sends, as bench_transfer.py
does, and again after every send (the cache state the next hand-off meets), and prints the goal's
ratio, memcpy / hand-off, for both; the first ``WARM_SENDS`` sends are not timed, as there.

    .venv/bin/python lab/benchmarks/bench_copy_hash.py [--kv 16] [--reps 40] [--rounds 3] [--handoff shm --sends 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "lab" / "benchmarks"))

from bench_transfer import WARM_SENDS, kv_payload  # noqa: E402
from transfer_baselines import memcpy  # noqa: E402
from epdctl.runtime.fast import native_copy  # noqa: E402
from epdctl.runtime.transports import open_transport, spans  # noqa: E402
from epdctl.runtime.transports.parts import PART_BYTES, split  # noqa: E402
from epdctl.runtime.wire import describe, layout  # noqa: E402


def times(fn: Callable[[], object], reps: int) -> list[float]:
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def measure(mib: float, reps: int, rounds: int) -> dict[str, tuple[float, float]]:
    """{variant: (best ms, median ms)} for a KV message of ``mib`` MiB."""
    header, bufs = describe({}, kv_payload(mib))
    offsets, total = layout(header["tensors"])
    cuts = split(header["tensors"], offsets, total, PART_BYTES)
    dst = np.zeros(total, np.uint8)
    lengths = [b.nbytes for b in bufs]
    srcs = [np.frombuffer(b, np.uint8) for b in bufs]
    dll = native_copy.library()

    def write(native: bool) -> Callable[[], object]:
        def run() -> None:
            native_copy._state["dll"] = dll if native else None
            for first, last in cuts:
                spans.write_span(bufs, offsets, dst, first, last)
        return run

    def memcpy() -> None:
        for s, off in zip(srcs, offsets):
            dst[off:off + s.nbytes] = s

    def check() -> None:
        for first, last in cuts:
            base = offsets[first]
            spans.span_sum(memoryview(dst)[base:], [o - base for o in offsets[first:last]], lengths[first:last])

    variants = {"numpy copy, then xxhash": write(False), "memcpy (no checksum)": memcpy, "receiver's check": check}
    if dll is not None:
        variants["fused copy + XXH3 (C)"] = write(True)
    got: dict[str, list[float]] = {k: [] for k in variants}
    try:
        for _ in range(rounds):
            for name, fn in variants.items():
                got[name] += times(fn, reps)
    finally:
        native_copy._state["dll"] = dll
    return {k: (min(v) * 1e3, statistics.median(v) * 1e3) for k, v in got.items()}


HANDOFF_PORT = 33406


async def _receive(channel: str, sends: int) -> None:
    t = open_transport("zmq", "127.0.0.1", port=HANDOFF_PORT, timeout=120, shm=channel == "shm")
    await t.start()
    print(json.dumps(t.address), flush=True)
    for i in range(sends):
        await t.recv(f"k{i}", 600)
    await t.close()


async def _send(address: str, channel: str, mib: float, sends: int) -> dict[str, list[float]]:
    t = open_transport("zmq", "127.0.0.1", timeout=120, shm=channel == "shm")
    await t.start()
    tensors, dll = kv_payload(mib), native_copy.library()
    variants = ["fused copy + XXH3 (C)", "numpy copy, then xxhash"]
    got: dict[str, list[float]] = {k: [] for k in variants + ["memcpy (no checksum)", "memcpy between sends"]}
    copy = memcpy(tensors)  # bench_transfer.py's baseline: back to back (L3-hot), and between the sends
    for _ in range(WARM_SENDS + sends // 2):
        t0 = time.perf_counter()
        copy()
        got["memcpy (no checksum)"].append(time.perf_counter() - t0)
    del got["memcpy (no checksum)"][:WARM_SENDS]
    try:
        for i in range(sends):
            name = variants[i % len(variants)]
            native_copy._state["dll"] = None if name.startswith("numpy") else dll
            t0 = time.perf_counter()
            await t.send(address, f"k{i}", {}, tensors)
            t1 = time.perf_counter()
            copy()
            if i >= WARM_SENDS:  # (as bench_transfer.py: the connection and both lent segments warm)
                got[name].append(t1 - t0)
                got["memcpy between sends"].append(time.perf_counter() - t1)
    finally:
        native_copy._state["dll"] = dll
        await t.close()
    return got


def handoff(channel: str, mib: float, sends: int) -> dict[str, tuple[float, float]]:
    """{variant: (best ms, median ms)} of whole hand-offs, the sender's loop alternated per send."""
    proc = subprocess.Popen([sys.executable, __file__, "--receiver", channel, "--sends", str(sends)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        address = json.loads(proc.stdout.readline())
        got = asyncio.run(_send(address, channel, mib, sends))
    finally:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # (the sender failed part-way: the receiver waits no more)
            proc.kill()
            proc.wait()
    return {k: (min(v) * 1e3, statistics.median(v) * 1e3) for k, v in got.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kv", type=float, default=16, help="KV message size, MiB")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--handoff", choices=["shm", "tcp"], help="whole hand-offs between two processes")
    ap.add_argument("--sends", type=int, default=100, help="hand-offs with --handoff (half each way)")
    ap.add_argument("--receiver", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.receiver:
        asyncio.run(_receive(args.receiver, args.sends))
        return
    if args.handoff:
        res = handoff(args.handoff, args.kv, args.sends + WARM_SENDS)
        print(f"KV {args.kv:g} MiB hand-offs over {args.handoff}, load {os.getloadavg()[0]:.2f}; ms best / median:")
    else:
        res = measure(args.kv, args.reps, args.rounds)
        print(f"KV {args.kv:g} MiB, parts of {PART_BYTES >> 20} MiB, load {os.getloadavg()[0]:.2f}; ms best / median:")
    for name, (best, med) in res.items():
        print(f"  {name:28s} {best:7.3f} / {med:7.3f}")
    fused = res.get("fused copy + XXH3 (C)")
    if fused:
        ref = res["numpy copy, then xxhash"]
        print(f"fused / numpy+xxhash: {fused[0] / ref[0]:.2f} (best), {fused[1] / ref[1]:.2f} (median)"
              + (f"; fused / memcpy: {fused[0] / res['memcpy (no checksum)'][0]:.2f} (best)" if not args.handoff else ""))
    if args.handoff and fused:  # the goal's ratio, as bench_transfer.py prints it (best / best)
        for base in ("memcpy (no checksum)", "memcpy between sends"):
            print(f"{base} / hand-off ({args.handoff}, fused): {res[base][0] / fused[0]:.2f} (best), "
                  f"{res[base][1] / fused[1]:.2f} (median)")


if __name__ == "__main__":
    main()
