"""Hand-off throughput of the runtime's transports vs a plain memory copy of the same bytes.

Measured, not asserted. One run: a receiver process opens ZMQ tcp, ZMQ ipc and Mooncake (TCP)
endpoints; this process sends embedding-sized and KV-sized payloads to each and times ``send()``
(pack + CRC32, transfer, receiver's size/CRC check and copy into fresh tensors, acknowledgement).
Baselines: a plain memory copy of the same tensors (into preallocated tensors), and the wire format alone (pack + unpack,
no socket). Prints a table and writes benchmarks/results/transfer.json.

    .venv/bin/python benchmarks/bench_transfer.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from epdctl.runtime.transports import open_transport  # noqa: E402
from epdctl.runtime.wire import pack, unpack  # noqa: E402

KINDS = ["zmq", "zmq-ipc", "mooncake"]
PORTS = {"zmq": 33400, "zmq-ipc": 0, "mooncake": 33401}
MiB = 2**20


def kv_payload(mib: float, layers: int = 28, heads: int = 2, dim: int = 128) -> dict[str, torch.Tensor]:
    """Per-layer K and V like Qwen2-VL-2B (28 layers, 2 KV heads, head_dim 128, bf16)."""
    per_token = layers * 2 * heads * dim * 2
    tokens = max(1, int(mib * MiB) // per_token)
    out = {}
    for i in range(layers):
        out[f"k{i}"] = torch.randn(1, heads, tokens, dim).bfloat16()
        out[f"v{i}"] = torch.randn(1, heads, tokens, dim).bfloat16()
    return out


def embed_payload(images: int, tokens: int, hidden: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {f"img{i}": torch.randn(tokens, hidden).to(dtype) for i in range(images)}


def tiny_hidden() -> int:
    cfg = ROOT / "models" / "tiny-qwen2vl" / "config.json"
    if cfg.is_file():
        return int(json.loads(cfg.read_text())["text_config"]["hidden_size"])
    return 64


def payloads(quick: bool) -> list[tuple[str, dict[str, torch.Tensor], int]]:
    """(label, tensors, repetitions)."""
    items = [
        ("embeds: tiny model, 8 images x 16 tok", embed_payload(8, 16, tiny_hidden(), torch.float32), 30),
        ("embeds: Qwen2-VL-2B, 8 images x 256 tok bf16", embed_payload(8, 256, 1536, torch.bfloat16), 10),
        ("KV 1 MiB", kv_payload(1), 10),
        ("KV 16 MiB", kv_payload(16), 5),
    ]
    if not quick:
        items.append(("KV 256 MiB", kv_payload(256), 3))
    return items


def nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def best_and_median(fn, reps: int) -> tuple[float, float]:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


async def receiver(expected: dict[str, int]) -> None:
    """Receive ``expected[kind]`` messages (keys kind-0, kind-1, ...) on each transport, then exit."""
    ts = {k: open_transport(k, "127.0.0.1", port=PORTS[k], timeout=120) for k in KINDS}
    for t in ts.values():
        await t.start()
    print(json.dumps({k: t.address for k, t in ts.items()}), flush=True)

    async def drain(kind: str) -> None:
        for i in range(expected[kind]):
            await ts[kind].recv(f"{kind}-{i}", 600)

    await asyncio.gather(*(drain(k) for k in KINDS))
    for t in ts.values():
        await t.close()


async def measure(addresses: dict[str, str], items, counters: dict[str, int]) -> list[dict]:
    senders = {k: open_transport(k, "127.0.0.1", timeout=120) for k in KINDS}
    for t in senders.values():
        await t.start()
    rows = []
    try:
        for label, tensors, reps in items:
            size = nbytes(tensors)
            row = {"payload": label, "bytes": size, "tensors": len(tensors), "reps": reps}
            dst = {k: torch.empty_like(t) for k, t in tensors.items()}
            row["memcpy_s"], row["memcpy_median_s"] = best_and_median(
                lambda: [dst[k].copy_(t) for k, t in tensors.items()], reps)
            row["wire_s"], row["wire_median_s"] = best_and_median(lambda: unpack(pack({}, tensors)), reps)
            for kind in KINDS:
                times = []
                for _ in range(reps + 1):
                    key = f"{kind}-{counters[kind]}"
                    counters[kind] += 1
                    t0 = time.perf_counter()
                    await senders[kind].send(addresses[kind], key, {}, tensors)
                    times.append(time.perf_counter() - t0)
                row[f"{kind}_s"], row[f"{kind}_median_s"] = min(times[1:]), statistics.median(times[1:])
            rows.append(row)
            print_row(row, header=len(rows) == 1)
    finally:
        for t in senders.values():
            await t.close()
    return rows


COLS = ["memcpy", "wire"] + KINDS


def print_row(row: dict, header: bool) -> None:
    if header:
        print(f"{'payload':46} {'MiB':>8} " + " ".join(f"{c:>22}" for c in COLS))
    cells = []
    for c in COLS:
        s = row[f"{c}_s"]
        gbs = row["bytes"] / s / 1e9
        ratio = s / row["memcpy_s"]
        cells.append(f"{s * 1e3:8.2f}ms {gbs:5.2f}GB/s x{ratio:4.1f}" if c != "memcpy" else
                     f"{s * 1e3:8.2f}ms {gbs:5.2f}GB/s     ")
    print(f"{row['payload']:46} {row['bytes'] / MiB:8.2f} " + " ".join(f"{c:>22}" for c in cells), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the 256 MiB payload")
    ap.add_argument("--receiver", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "transfer.json"))
    args = ap.parse_args()
    if args.receiver:
        asyncio.run(receiver(json.loads(args.receiver)))
        return
    items = payloads(args.quick)
    expected = {k: sum(reps + 1 for _, _, reps in items) for k in KINDS}
    env = dict(os.environ, GLOG_minloglevel="2")
    proc = subprocess.Popen([sys.executable, __file__, "--receiver", json.dumps(expected)],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        addresses = json.loads(proc.stdout.readline())
        counters = {k: 0 for k in KINDS}
        rows = asyncio.run(measure(addresses, items, counters))
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print("\ntimes: best of the repetitions (the host is shared; medians are in the JSON);")
    print("GB/s = payload bytes / time; xN = time / plain memcpy time.")
    print("wire = pack + CRC32 + unpack (CRC check + copy) in one process, no socket.")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"host": platform.node(), "cpus": os.cpu_count(), "torch": torch.__version__,
                               "load_avg_1m": os.getloadavg()[0], "time_is": "best of reps (+ *_median_s)",
                               "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
