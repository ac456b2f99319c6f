"""Decode batching through HTTP: does the serving path keep what the engine's batching gives?

bench_decode_batch.py drives a DecodeEngine in-process. A client sees more: every step's tokens
cross to the event loop, and each stream's coroutine detokenizes, encodes and writes an SSE chunk
per token, on the same GIL as the engine thread. This starts one real colocated worker
(``python -m epdctl.runtime colocated``, one torch thread, on a free loopback port), sends 1 and
``--streams`` concurrent streaming chat requests (text prompts of different lengths, greedy,
``ignore_eos``), rounds alternating, and reports the median TPOT (time between a stream's
first and last chunk over its tokens) and aggregate tokens/s (completion tokens over the wall
time of the round). The same prompts decoded in-process by a DecodeEngine in this run give the
engine's own ms/step beside it, and the worker's threads' CPU time per generated token (from
/proc) shows what the event loop spends beside the engine thread. Writes benchmarks/results/decode_http.json. Start it under the
heavy-test lock (it starts a worker).

    .venv/bin/python benchmarks/bench_decode_http.py [--streams 16] [--tokens 96] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_stages import model_dir  # noqa: E402
from epdctl.runtime.decode_engine import DecodeEngine  # noqa: E402
from epdctl.runtime.model import load_bundle  # noqa: E402
from epdctl.runtime.prefill_engine import LanguagePrefill  # noqa: E402
from epdctl.runtime.prompt import build_prompt  # noqa: E402
from epdctl.runtime.sampling import SamplingParams  # noqa: E402

WORDS = "red circle blue square green triangle how many shapes are there in the picture".split()


def prompt(i: int) -> str:
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(4 + 3 * i))


async def one_stream(session: aiohttp.ClientSession, url: str, model: str, i: int, tokens: int) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": prompt(i)}], "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "return_token_ids": True}
    times: list[float] = []
    count = 0
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            ids = json.loads(line[6:])["choices"][0].get("token_ids") or []
            if ids:
                times.append(time.perf_counter())
                count += len(ids)
    return {"tokens": count, "tpot_s": (times[-1] - times[0]) / max(count - 1, 1)}


async def http_round(url: str, model: str, n: int, tokens: int) -> dict:
    async with aiohttp.ClientSession() as session:
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(one_stream(session, url, model, i, tokens) for i in range(n)))
        wall = time.perf_counter() - t0
    return {"tokens_per_s": sum(o["tokens"] for o in outs) / wall,
            "tpot_ms": statistics.median(o["tpot_s"] for o in outs) * 1e3}


def engine_ms_per_step(bundle, n: int, tokens: int) -> float:
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    pre, engine = LanguagePrefill(bundle), DecodeEngine(bundle, max_running=n)
    for i in range(n):
        p = build_prompt(bundle, [{"role": "user", "content": prompt(i)}], [])
        engine.add(f"s{i}", pre.prefill(p, [], params), params)
    engine.step()
    t0, steps = time.perf_counter(), 0
    while engine.num_running:
        engine.step()
        steps += 1
    return (time.perf_counter() - t0) / steps * 1e3


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of ``pid`` (Linux /proc; empty elsewhere)."""
    out: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the worker exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit("the worker did not become healthy")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="checkpoint folder (default: models/tiny-qwen2vl, else a random tiny one)")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "decode_http.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    path, source = model_dir(args.model)
    bundle = load_bundle(path, role="colocated")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "epdctl.runtime", "colocated", "--model-path", path, "--host",
                             "127.0.0.1", "--port", str(port), "--threads", "1", "--max-running-requests",
                             str(max(args.streams, 1))], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    best: dict[str, dict[int, dict]] = {"http": {}, "engine": {}}
    try:
        wait_healthy(url, proc)
        sizes = (1, args.streams)
        cpu0, tokens_sent = thread_cpu_s(proc.pid), 0
        for _ in range(args.rounds):
            for n in sizes:  # alternate 1 and N streams, HTTP and in-process
                r = asyncio.run(http_round(url, bundle.served_name, n, args.tokens))
                tokens_sent += n * args.tokens
                if n not in best["http"] or r["tpot_ms"] < best["http"][n]["tpot_ms"]:
                    best["http"][n] = r
                ms = engine_ms_per_step(bundle, n, args.tokens)
                if n not in best["engine"] or ms < best["engine"][n]["tpot_ms"]:
                    best["engine"][n] = {"tpot_ms": ms, "tokens_per_s": n / ms * 1e3}
        cpu1 = thread_cpu_s(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
    one, many = 1, args.streams
    print(f"{'path':>8} {'streams':>7} {'TPOT ms':>8} {'tokens/s':>9} {'x one (by TPOT)':>16}")
    for where in ("engine", "http"):
        for n in sizes:
            r = best[where][n]
            r["x_one"] = n * best[where][one]["tpot_ms"] / r["tpot_ms"]
            print(f"{where:>8} {n:7d} {r['tpot_ms']:8.2f} {r['tokens_per_s']:9.0f} {r['x_one']:15.1f}x")
    used = sorted(((cpu1.get(t, 0.0) - cpu0.get(t, 0.0), t) for t in cpu1), reverse=True)
    per_token = {("event loop (main thread)" if t == proc.pid else f"thread {t}"): c / tokens_sent * 1e6
                 for c, t in used[:3]}
    print("worker CPU per generated token (us), busiest threads: "
          + ", ".join(f"{k} {v:.0f}" for k, v in per_token.items()))
    print(f"threads 1, load {os.getloadavg()[0]:.2f}; best of {args.rounds} rounds; HTTP tokens/s includes "
          f"the prefills and the HTTP hops, engine tokens/s is decode steps only; worker log {log.name}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": source, "tokens": args.tokens, "rounds": args.rounds, "threads": 1,
                               "load_avg_1m": os.getloadavg()[0], "streams": many,
                               "worker_cpu_us_per_token": per_token,
                               "engine": {str(k): v for k, v in best["engine"].items()},
                               "http": {str(k): v for k, v in best["http"].items()}}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
