"""Per-stage times of the split pipeline for 1, 4 and 8 images, engines in one process.

Measured, not asserted (best of the repetitions; the host is shared): encode (vision tower, cache off), embedding hand-off (E->P), prefill,
KV hand-off (P->D) over ZMQ tcp and Mooncake (real sockets on loopback), decode time per token.
Uses models/tiny-qwen2vl when it holds a checkpoint, else a tiny random one. Writes
benchmarks/results/stages.json.

    .venv/bin/python benchmarks/bench_stages.py [--model DIR] [--reps 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from epdctl.runtime.fast.decode import FastDecodeEngine as DecodeEngine  # noqa: E402
from epdctl.runtime.encoder_engine import VisionEncoder  # noqa: E402
from epdctl.runtime.model import load_bundle  # noqa: E402
from epdctl.runtime.prefill_engine import LanguagePrefill  # noqa: E402
from epdctl.runtime.prompt import build_prompt  # noqa: E402
from epdctl.runtime.sampling import SamplingParams  # noqa: E402
from epdctl.runtime.transports import open_transport  # noqa: E402
from epdctl.runtime.wire import embeds_to_tensors, kv_to_tensors  # noqa: E402
from epdctl.shapes import make_request  # noqa: E402

DECODE_TOKENS = 32


def model_dir(arg: str | None) -> tuple[str, str]:
    if arg:
        return arg, "given"
    trained = ROOT / "models" / "tiny-qwen2vl"
    if (trained / "model.safetensors").is_file():
        return str(trained), "models/tiny-qwen2vl"
    sys.path.insert(0, str(ROOT / "tests" / "runtime"))
    from tiny_model import build_tiny_checkpoint

    return str(build_tiny_checkpoint(Path(tempfile.mkdtemp()) / "tiny")), "random tiny (tests/runtime/tiny_model.py)"


def timed(fn, reps: int) -> tuple[float, object]:
    """Best-of-``reps`` milliseconds (the host is shared; the best is the least disturbed run)."""
    out = fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3, out


async def handoff_ms(pair, meta, tensors, reps: int) -> float:
    a, b = pair
    times = []
    for i in range(reps + 1):
        t0 = time.perf_counter()
        await a.send(b.address, f"k{i}", meta, tensors)
        await b.recv(f"k{i}", 60)
        times.append(time.perf_counter() - t0)
    return min(times[1:]) * 1e3


async def run(args) -> dict:
    path, source = model_dir(args.model)
    bundle = load_bundle(path, role="colocated")
    encoder = VisionEncoder(bundle, cache_mb=0)
    prefill = LanguagePrefill(bundle)
    pairs = {}
    for kind in ("zmq", "mooncake"):
        pair = (open_transport(kind, "127.0.0.1"), open_transport(kind, "127.0.0.1"))
        for t in pair:
            await t.start()
        pairs[kind] = pair
    rows = []
    try:
        for n in (1, 4, 8):
            pngs, question, _ = make_request(random.Random(n), n, plain=True)
            messages = [{"role": "user", "content": [{"type": "image"}] * n + [{"type": "text", "text": question}]}]
            encode_ms, encoded = timed(lambda: encoder.encode(pngs), args.reps)
            prompt = build_prompt(bundle, messages, [e.grid_thw for e in encoded])
            params = SamplingParams(max_tokens=DECODE_TOKENS, ignore_eos=True)
            prefill_ms, result = timed(lambda: prefill.prefill(prompt, encoded, params), args.reps)
            emb_meta, emb_tensors = embeds_to_tensors(encoded)
            kv_meta, kv_tensors = kv_to_tensors(result)
            row = {"images": n, "prompt_tokens": result.prompt_len, "encode_ms": encode_ms, "prefill_ms": prefill_ms,
                   "embedding_bytes": sum(t.numel() * t.element_size() for t in emb_tensors.values()),
                   "kv_bytes": sum(t.numel() * t.element_size() for t in kv_tensors.values())}
            for kind, pair in pairs.items():
                row[f"embed_handoff_{kind}_ms"] = await handoff_ms(pair, emb_meta, emb_tensors, args.reps)
                row[f"kv_handoff_{kind}_ms"] = await handoff_ms(pair, kv_meta, kv_tensors, args.reps)
            engine = DecodeEngine(bundle)
            engine.add("b", result, params)
            engine.step()  # emits the prefill's token; no forward
            step_ms = []
            while engine.num_running:
                t0 = time.perf_counter()
                engine.step()
                step_ms.append((time.perf_counter() - t0) * 1e3)
            row["decode_tokens"] = len(step_ms)
            row["decode_ms_per_token"] = statistics.median(step_ms) if step_ms else 0.0
            rows.append(row)
    finally:
        for pair in pairs.values():
            for t in pair:
                await t.close()
    return {"model": source, "path": path, "reps": args.reps, "load_avg_1m": os.getloadavg()[0], "threads": torch.get_num_threads(), "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="checkpoint folder (default: models/tiny-qwen2vl, else a random tiny one)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "stages.json"))
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: steadier on a busy host)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    report = asyncio.run(run(args))
    print(f"model: {report['model']}  (best of {args.reps}; decode: median step; {report['threads']} torch thread(s))")
    cols = ["images", "prompt_tokens", "encode_ms", "embed_handoff_zmq_ms", "embed_handoff_mooncake_ms", "prefill_ms",
            "kv_bytes", "kv_handoff_zmq_ms", "kv_handoff_mooncake_ms", "decode_ms_per_token", "decode_tokens"]
    print(" ".join(f"{c:>16}" for c in cols))
    for row in report["rows"]:
        print(" ".join(f"{row[c]:16.2f}" if isinstance(row[c], float) else f"{row[c]:16d}" for c in cols))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
