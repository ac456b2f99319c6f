"""The timeline of same-host shared-memory hand-offs, stamped on both ends.

Measured, not asserted. A receiver process and this (sender) process run the runtime's ZMQ
transport with shared memory; both wrap the same-host path's steps with ``time.perf_counter``
stamps (CLOCK_MONOTONIC on Linux: one clock for both processes) without changing the code:
sender -- send() entered, each part's copy + hash (start, end), each publish, each doorbell ring,
the answer seen, send() returned; receiver -- each ring read, each check of newly published parts
(start, end, how many), the answer written, recv() returned. Prints, for the hand-off with the
median send time (and the best), every stamp in ms from send() entered, and a summary over all
hand-offs: where the time goes (the sender's writing, its wait for the answer; the receiver's
checks, its wake after the last part).

    .venv/bin/python lab/benchmarks/handoff_timeline.py [--kv 16] [--sends 40] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "lab" / "benchmarks"))

from epdctl.runtime.fast.transports import leases, progress, same_host  # noqa: E402
from epdctl.runtime.fast.transports.shm_zmq import ShmZmqTransport  # noqa: E402
from epdctl.runtime.transports import open_transport  # noqa: E402
from epdctl.runtime.fast.transports.doorbell import Doorbell  # noqa: E402
from epdctl.runtime.transports.zmq import ZmqTransport  # noqa: E402

PORT = 33407
WARM = 5  # hand-offs not timed (as bench_transfer.WARM_SENDS: every lent segment faulted in)
STAMPS: list[tuple[float, str]] = []


def stamp(what: str) -> None:
    STAMPS.append((time.perf_counter(), what))


def wrap_sync(owner: Any, name: str, label: Callable[..., str], after: bool = True) -> None:
    fn = getattr(owner, name)

    def wrapped(*a: Any, **kw: Any) -> Any:
        stamp(label(*a, **kw) + " start" if after else label(*a, **kw))
        out = fn(*a, **kw)
        if after:
            stamp(label(*a, **kw) + " end")
        return out
    setattr(owner, name, wrapped)


def wrap_async(owner: Any, name: str, label: Callable[..., str], result: Callable[[Any], str] | None = None) -> None:
    fn = getattr(owner, name)

    async def wrapped(*a: Any, **kw: Any) -> Any:
        stamp(label(*a, **kw) + " start")
        out = await fn(*a, **kw)
        stamp(label(*a, **kw) + " end" + (result(out) if result else ""))
        return out
    setattr(owner, name, wrapped)


def instrument(side: str) -> None:
    """Stamp the steps of ``side`` ('send' or 'recv')."""
    ring = Doorbell.ring
    Doorbell.ring = lambda self, address, data: (stamp(f"ring {data[:1].decode()} out"), ring(self, address, data))[1]
    if side == "send":
        wrap_async(ZmqTransport, "send", lambda self, peer, key, *a: f"send {key}")
        write = ZmqTransport.write_part

        async def written(*a: Any) -> Any:
            stamp(f"copy {a[2]} start")
            out = await write(*a)
            stamp(f"copy {a[2]} end")
            return out
        ZmqTransport.write_part = staticmethod(written)  # type: ignore[method-assign]
        wrap_sync(progress.Control, "publish", lambda self, i, d: f"publish {i}", after=False)
        wrap_async(progress.Control, "wait_reply", lambda *a: "poll answer", lambda r: "" if r is None else " (got)")
        return
    on_ring = same_host.SameHost.ring
    same_host.SameHost.ring = lambda t, data: (stamp(f"ring {data[:1].decode()} in"), on_ring(t, data))[1]  # type: ignore[method-assign]
    check = leases.Lease.check

    async def checked(lease: Any) -> bool:
        first = lease.checked
        t0 = time.perf_counter()
        got = await check(lease)
        if got:
            STAMPS.append((t0, f"check {first}..{lease.checked - 1} start"))
            stamp(f"check {first}..{lease.checked - 1} end")
        return got
    leases.Lease.check = checked  # type: ignore[method-assign]
    wrap_sync(same_host.SameHost, "_close", lambda *a: "answer", after=False)
    wrap_sync(leases.Leases, "lend", lambda *a: "lend a segment")


def cpu_s() -> float:
    """This process's CPU seconds, every thread (ZMQ's I/O threads too)."""
    return time.process_time()


def faults() -> int:
    """This process's minor page faults so far (fresh pages mapped in)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


async def _receive(sends: int, out: str, shm: bool) -> None:
    instrument("recv")
    t = open_transport("zmq", "127.0.0.1", port=PORT, timeout=120, shm=shm)
    await t.start()
    print(json.dumps(t.address), flush=True)
    for i in range(sends):
        await t.recv(f"k{i}", 600)
        stamp(f"recv {i} returned")
        if i == WARM - 1:
            STAMPS.extend([(cpu_s(), "cpu warm"), (faults(), "cpu faults warm")])
    STAMPS.extend([(cpu_s(), "cpu end"), (faults(), "cpu faults end")])
    stamp(f"segments {t.shm.pool.stats if isinstance(t, ShmZmqTransport) and t.shm.pool else None}")
    await t.close()
    Path(out).write_text(json.dumps(STAMPS))


async def _send(address: str, mib: float, sends: int, shm: bool,
                part_kib: int = 0) -> tuple[list[tuple[float, float]], float]:
    """(start, end) of every send, and the CPU seconds of the timed (warm) ones."""
    from bench_transfer import kv_payload  # (it imports this module for its --timeline)
    instrument("send")
    t = open_transport("zmq", "127.0.0.1", timeout=120, shm=shm)
    if part_kib and isinstance(t, ZmqTransport):
        t.part_bytes = part_kib << 10
    await t.start()
    tensors = kv_payload(mib)
    spans, cpu0, faults0 = [], 0.0, 0
    try:
        for i in range(sends):
            if i == WARM:
                cpu0, faults0 = cpu_s(), faults()
            t0 = time.perf_counter()
            await t.send(address, f"k{i}", {}, tensors)
            spans.append((t0, time.perf_counter()))
    finally:
        cpu = cpu_s() - cpu0
        STAMPS.append((faults() - faults0, "cpu faults"))
        await t.close()
    return spans, cpu


def show(i: int, t0: float, t1: float, events: list[tuple[float, str, str]]) -> None:
    print(f"hand-off {i}: {1e3 * (t1 - t0):.3f} ms")
    for t, side, what in events:
        if t0 - 1e-4 <= t <= t1 + 5e-4:
            print(f"  {1e3 * (t - t0):8.3f}  {side:4} {what}")


def phases(events: list[tuple[float, str, str]]) -> list[dict[str, float]]:
    """Per hand-off (``send N start`` .. ``send N end``), ms: total; before the first copy (header,
    GO); writing (first copy to last publish); the tail (last publish to the receiver's answer);
    the answer's way back (answer to send() returning); the receiver's checks (summed) and its first
    look after the GO ring; sends that found no doorbell answer path show 0 for what they lack."""
    out: list[dict[str, float]] = []
    cur: dict[str, Any] | None = None
    for t, side, what in events:
        if side == "send" and what.startswith("send ") and what.endswith(" start"):
            cur = {"t0": t, "copy0": 0.0, "publish": 0.0, "answer": 0.0, "check": 0.0, "check_start": None}
        elif cur is None:
            continue
        elif what.startswith("copy") and what.endswith("start") and not cur["copy0"]:
            cur["copy0"] = t
        elif what.startswith("publish"):
            cur["publish"] = t
        elif what.startswith("check") and what.endswith("start"):
            cur["check_start"] = t
        elif what.startswith("check") and what.endswith("end") and cur["check_start"] is not None:
            cur["check"] += t - cur["check_start"]
        elif what == "answer":
            cur["answer"] = t
        elif side == "send" and what.startswith("send ") and what.endswith(" end"):
            t0 = cur["t0"]
            out.append({"total": t - t0, "before_copy": cur["copy0"] - t0,
                        "writing": cur["publish"] - cur["copy0"],
                        "tail": cur["answer"] - cur["publish"] if cur["answer"] else 0.0,
                        "answer_back": t - cur["answer"] if cur["answer"] else 0.0, "checks": cur["check"]})
            cur = None
    return [{k: round(v * 1e3, 3) for k, v in row.items()} for row in out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kv", type=float, default=16)
    ap.add_argument("--sends", type=int, default=40)
    ap.add_argument("--channel", choices=["shm", "tcp"], default="shm",
                    help="tcp: shared memory off (the stamps then show only send(); the CPU figures hold)")
    ap.add_argument("--part-kib", type=int, default=0, help="the sender's part size (default: the transport's)")
    ap.add_argument("--json", help="write every stamp here")
    ap.add_argument("--receiver", help=argparse.SUPPRESS)
    args = ap.parse_args()
    shm = args.channel == "shm"
    if args.receiver:
        asyncio.run(_receive(args.sends, args.receiver, shm))
        return
    out = f"/tmp/handoff-timeline-{os.getpid()}.json"
    proc = subprocess.Popen([sys.executable, __file__, "--receiver", out, "--sends", str(args.sends),
                             "--channel", args.channel], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        spans, cpu = asyncio.run(_send(json.loads(proc.stdout.readline()), args.kv, args.sends, shm,
                                     args.part_kib))
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    theirs = json.loads(Path(out).read_text())
    os.unlink(out)
    their_cpu = {w: t for t, w in theirs if w.startswith("cpu ")}
    theirs = [(t, w) for t, w in theirs if not w.startswith("cpu ")]
    events = sorted([(t, "send", w) for t, w in STAMPS if not w.startswith("cpu ")]
                    + [(t, "recv", w) for t, w in theirs])
    warm = spans[WARM:]
    times = [b - a for a, b in warm]
    order = sorted(range(len(warm)), key=lambda k: times[k])
    for k in (order[0], order[len(order) // 2]):
        show(k + WARM, *warm[k], events)
    rows = phases(events)[WARM:]
    if shm and rows:
        print("phases, ms (median over the warm hand-offs): " + ", ".join(
            f"{k} {statistics.median(r[k] for r in rows):.3f}" for k in rows[0]))
    n, our_faults = len(warm), next(t for t, w in STAMPS if w == "cpu faults")
    print(f"KV {args.kv:g} MiB over {args.channel}, {n} warm hand-offs, load {os.getloadavg()[0]:.2f}: "
          f"best {1e3 * times[order[0]]:.3f} / median {1e3 * statistics.median(times):.3f} ms; per hand-off: CPU "
          f"sender {1e3 * cpu / n:.3f} ms, receiver {1e3 * (their_cpu['cpu end'] - their_cpu['cpu warm']) / n:.3f} ms; "
          f"page faults sender {our_faults / n:.0f}, receiver "
          f"{(their_cpu['cpu faults end'] - their_cpu['cpu faults warm']) / n:.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"spans": spans, "events": events}))


if __name__ == "__main__":
    main()
