"""The embedded runtime's two paths side by side: the reference (plain torch and ZMQ) and ``--fast``.

Measured, not asserted. In one process, on the same prefilled requests, turn by turn in
alternating order (so a change of the shared host's load hits both paths):
- decode tokens/s with 1 and 16 streams in one engine (``DecodeEngine`` against
  ``FastDecodeEngine``; every stream runs ``--tokens`` tokens, ignore_eos, greedy);
- time to first token of a 4-image request through the disaggregated hand-offs: encode, the
  embeddings over the path's zmq transport to the prefill, the prefill, its KV over the
  transport to the decode, and the decode engine's first step (the reference transport is
  socket-only; the fast one hands over through shared memory and hashes in C).
Reported: each path's median over the turns and the median of each turn's fast/reference ratio.
The tokens of both paths are compared too (they must be equal). Uses models/tiny-qwen2vl when it
holds a checkpoint, else a tiny random one.

    .venv/bin/python benchmarks/bench_runtime_paths.py [--tokens 32] [--reps 5] [--threads 1] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from epdctl.runtime import wire  # noqa: E402
from epdctl.runtime.decode_engine import DecodeEngine  # noqa: E402
from epdctl.runtime.encoder_engine import VisionEncoder  # noqa: E402
from epdctl.runtime.model import ModelBundle, load_bundle  # noqa: E402
from epdctl.runtime.prefill_engine import LanguagePrefill, PrefillResult  # noqa: E402
from epdctl.runtime.prompt import build_prompt  # noqa: E402
from epdctl.runtime.sampling import SamplingParams  # noqa: E402
from epdctl.runtime.transports import open_transport  # noqa: E402
from epdctl.shapes import make_request  # noqa: E402

PATHS = ("reference", "fast")


def model_dir() -> Path:
    committed = ROOT / "models" / "tiny-qwen2vl"
    if (committed / "config.json").is_file():
        return committed
    sys.path.insert(0, str(ROOT / "tests" / "runtime"))
    from tiny_model import build_tiny_checkpoint
    return build_tiny_checkpoint(Path(tempfile.mkdtemp(prefix="tiny-qwen2vl-")))


def messages(images: int, question: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}] * images + [{"type": "text", "text": question}]}]


def requests(n: int) -> list[tuple[list[bytes], str]]:
    """``n`` requests of 1..8 images (different prompt lengths)."""
    out = []
    for i in range(n):
        pngs, question, _ = make_request(random.Random(i), 1 + i % 8, plain=True)
        out.append((pngs, question))
    return out


def prefill_all(bundle: ModelBundle, reqs: list[tuple[list[bytes], str]], params: SamplingParams) -> list[PrefillResult]:
    enc, pre = VisionEncoder(bundle, cache_mb=0), LanguagePrefill(bundle)
    out = []
    for pngs, question in reqs:
        encoded = enc.encode(pngs)
        out.append(pre.prefill(build_prompt(bundle, messages(len(pngs), question), [e.grid_thw for e in encoded]),
                               encoded, params))
    return out


def decode_run(engine: DecodeEngine, results: list[PrefillResult], params: SamplingParams) -> tuple[float, list]:
    """Seconds to run every stream to its end in one engine, and the tokens per stream."""
    for i, r in enumerate(results):
        engine.add(f"s{i}", r, params)
    tokens: dict[str, list[int]] = {f"s{i}": [] for i in range(len(results))}
    t0 = time.perf_counter()
    while engine.num_running:
        for sid, tok, _ in engine.step():
            tokens[sid].append(tok)
    return time.perf_counter() - t0, list(tokens.values())


class Pipeline:
    """An encoder, a prefill and a decode engine in one process, joined by one path's transports
    (opened once, so every timed request finds them connected)."""

    def __init__(self, bundle: ModelBundle, engine: DecodeEngine, shm: bool):
        self.bundle, self.engine = bundle, engine
        self.enc, self.pre = VisionEncoder(bundle, cache_mb=0), LanguagePrefill(bundle)
        self.e, self.p, self.d = (open_transport("zmq", "127.0.0.1", timeout=60, shm=shm) for _ in range(3))

    async def start(self) -> None:
        for t in (self.e, self.p, self.d):
            await t.start()

    async def close(self) -> None:
        for t in (self.e, self.p, self.d):
            await t.close()

    async def ttft(self, pngs: list[bytes], question: str, params: SamplingParams) -> tuple[float, int]:
        """Seconds from the request to the decode's first token through E -> P -> D hand-offs."""
        t0 = time.perf_counter()
        encoded = self.enc.encode(pngs)
        await self.e.send(self.p.address, "emb", {}, {f"e{i}": x.embeds for i, x in enumerate(encoded)})
        _, embeds = await self.p.recv("emb", 60)
        got = [dataclasses.replace(x, embeds=embeds[f"e{i}"]) for i, x in enumerate(encoded)]
        prompt = build_prompt(self.bundle, messages(len(pngs), question), [x.grid_thw for x in got])
        result = self.pre.prefill(prompt, got, params)
        await self.p.send(self.d.address, "kv", {}, {f"{kind}{i}": t for i, kv in enumerate(result.kv)
                                                       for kind, t in zip("kv", kv)})
        _, kv = await self.d.recv("kv", 60)
        layers = [(kv[f"k{i}"], kv[f"v{i}"]) for i in range(len(result.kv))]
        self.engine.add("first", dataclasses.replace(result, kv=layers), params)
        first = self.engine.step()[0][1]
        took = time.perf_counter() - t0
        self.engine.abort("first")
        return took, first


def median_ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b))


def turns(reps: int, run: Callable[[str], float]) -> dict[str, list[float]]:
    """``run(path)`` for both paths each turn, the order alternating."""
    got: dict[str, list[float]] = {p: [] for p in PATHS}
    for rep in range(reps):
        for path in (PATHS if rep % 2 == 0 else PATHS[::-1]):
            got[path].append(run(path))
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32, help="tokens per decode stream")
    ap.add_argument("--reps", type=int, default=5, help="turns (both paths each turn)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--json", default="", help="also write the figures here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from epdctl.runtime.fast.decode import FastDecodeEngine
    from epdctl.runtime.fast.native_copy import NativeCopyHash

    bundle = load_bundle(str(model_dir()), role="colocated")
    params = SamplingParams(max_tokens=args.tokens, ignore_eos=True)
    results = prefill_all(bundle, requests(16), params)
    engines: dict[str, Callable[[], DecodeEngine]] = {
        "reference": lambda: DecodeEngine(bundle, max_running=16),
        "fast": lambda: FastDecodeEngine(bundle, max_running=16)}
    if not engines["fast"]().fast:  # type: ignore[attr-defined]
        print("note: the fast decode step fell back to the reference step on this host")

    def select(path: str) -> None:
        wire.use_accelerator(NativeCopyHash() if path == "fast" else None)

    rows: list[tuple[str, str, dict[str, list[float]]]] = []
    tokens: dict[str, dict[int, list]] = {p: {} for p in PATHS}
    for streams in (1, 16):
        def decode(path: str, streams: int = streams) -> float:
            select(path)
            secs, toks = decode_run(engines[path](), results[:streams], params)
            tokens[path][streams] = toks
            return streams * args.tokens / secs
        rows.append((f"decode tokens/s, {streams} stream{'s' if streams > 1 else ''}", "higher", turns(args.reps, decode)))

    pngs, question = requests(4)[3]  # 4 images
    first_tokens: dict[str, int] = {}
    loop = asyncio.new_event_loop()
    pipes = {p: Pipeline(bundle, engines[p](), shm=p == "fast") for p in PATHS}
    for path, pipe in pipes.items():
        select(path)
        loop.run_until_complete(pipe.start())
        loop.run_until_complete(pipe.ttft(pngs, question, params))  # connects, leases a first segment

    def first(path: str) -> float:
        select(path)
        secs, tok = loop.run_until_complete(pipes[path].ttft(pngs, question, params))
        first_tokens[path] = tok
        return secs * 1000
    rows.append(("TTFT ms, 4-image request (E->P->D)", "lower", turns(args.reps, first)))
    for pipe in pipes.values():
        loop.run_until_complete(pipe.close())
    loop.close()
    select("reference")

    same = tokens["reference"] == tokens["fast"] and first_tokens["reference"] == first_tokens["fast"]
    print(f"threads {torch.get_num_threads()}, {args.reps} turns, {args.tokens} tokens per stream; "
          f"same tokens on both paths: {same}")
    print(f"{'':40} {'reference':>12} {'fast':>12} {'fast/ref':>10}")
    out: dict[str, Any] = {"threads": torch.get_num_threads(), "reps": args.reps, "tokens": args.tokens,
                           "same_tokens": same, "rows": {}}
    for name, better, got in rows:
        ref, fast = statistics.median(got["reference"]), statistics.median(got["fast"])
        ratio = median_ratio(got["fast"], got["reference"])
        print(f"{name:40} {ref:12.2f} {fast:12.2f} {ratio:9.2f}x  ({better} is better)")
        out["rows"][name] = {"reference": got["reference"], "fast": got["fast"], "median_ratio": round(ratio, 3)}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
