"""Asyncio load generator for any OpenAI-compatible chat endpoint (embedded, SGLang, vLLM, smg).

Why streaming: TTFT and TPOT are only visible to a client that reads tokens as they arrive.
Each request asks for ``stream_options.include_usage`` so token counts come from the server
(content chunks are the fallback), and keeps the ``timings`` object the embedded decode adds
to its last chunk (absent on other engines; the report then leaves per-stage times out).

Arrival processes: open loop (Poisson at ``rate``; requests are sent on schedule whether or not
earlier ones finished, so an overloaded server shows growing latency instead of a slower
client) or closed loop (``concurrency`` requests always in flight).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from epdctl.bench.workload import Request, RequestSource, Workload

log = logging.getLogger(__name__)


ZERO_TOKENS = "0 tokens generated"  # a response with no text: a failure, never a fast success

@dataclass
class Sample:
    """What one request measured (seconds; ``start`` is relative to the run's start)."""

    index: int
    start: float
    n_images: int
    repeated: int
    ok: bool = False
    status: int = 0
    ttft: float | None = None
    tpot: float | None = None
    latency: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    correct: bool | None = None
    error: str = ""
    timings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Target:
    """Where to send: the base URL (without /v1), model name and optional bearer key."""

    base_url: str
    model: str
    api_key: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h


def body_for(req: Request, model: str, max_tokens: int, ignore_eos: bool = False) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                            + base64.b64encode(p).decode()}} for p in req.pngs]
    parts.append({"type": "text", "text": req.question})
    body = {"model": model, "messages": [{"role": "user", "content": parts}],
            "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    if ignore_eos:  # SGLang's and vLLM's extension, and the embedded engine's
        body["ignore_eos"] = True
    return body


async def send_one(session: Any, target: Target, req: Request, w: Workload,
                   t_run: float) -> Sample:
    """Stream one request and time it; never raises for server or network errors."""
    import aiohttp

    from epdctl import shapes

    s = Sample(req.index, time.perf_counter() - t_run, len(req.pngs), req.repeated)
    t0 = time.perf_counter()
    stamps: list[float] = []
    text: list[str] = []
    try:
        async with session.post(target.base_url.rstrip("/") + "/v1/chat/completions",
                                json=body_for(req, target.model, w.max_tokens, w.ignore_eos),
                                headers=target.headers,
                                timeout=aiohttp.ClientTimeout(total=w.timeout)) as resp:
            s.status = resp.status
            if resp.status != 200:
                s.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                s.latency = time.perf_counter() - t0
                return s
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if isinstance(chunk.get("error"), dict):
                    s.error = str(chunk["error"].get("message", chunk["error"]))[:200]
                    break
                if isinstance(chunk.get("usage"), dict):
                    s.prompt_tokens = chunk["usage"].get("prompt_tokens", s.prompt_tokens)
                    s.completion_tokens = int(chunk["usage"].get("completion_tokens") or 0)
                if isinstance(chunk.get("timings"), dict):
                    s.timings = {k: float(v) for k, v in chunk["timings"].items()
                                 if isinstance(v, (int, float))}
                for ch in chunk.get("choices") or []:
                    piece = (ch.get("delta") or {}).get("content")
                    if piece:
                        stamps.append(time.perf_counter())
                        text.append(piece)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
        s.error = f"{type(e).__name__}: {e}"[:200] or type(e).__name__
    end = time.perf_counter()
    s.latency = end - t0
    if s.error:
        return s
    if not stamps or not "".join(text).strip():
        # a pipeline that returns nothing answers fast: never a fast success
        s.error = (f"{ZERO_TOKENS} (the stream ended with an empty completion"
                   + (f", usage.completion_tokens {s.completion_tokens}" if s.completion_tokens == 0 else "")
                   + ")")
        return s
    s.ok = True
    s.ttft = stamps[0] - t0
    s.completion_tokens = s.completion_tokens or len(stamps)
    if s.completion_tokens > 1 and len(stamps) > 1:
        s.tpot = (stamps[-1] - stamps[0]) / (s.completion_tokens - 1)
    items = shapes.parse_answer("".join(text), len(req.pngs))
    s.correct = "\n".join(f"Picture {i}: {it}" for i, it in enumerate(items, 1)
                          if it is not None) == req.expected
    if not s.correct and s.completion_tokens >= w.max_tokens and items[-1] is None:
        s.correct = None  # cut off by max_tokens before the last picture: not judged
    return s


Progress = Callable[[int, int, int, float], None]  # done, sent, errors, elapsed


async def run_load(target: Target, w: Workload, progress: Progress | None = None) -> tuple[list[Sample], float]:
    """Send the workload; returns the samples (in request order) and the wall time."""
    import aiohttp

    if w.rate is None and w.concurrency is None:
        raise ValueError("a workload needs a rate or a concurrency to run")
    source = RequestSource(w)
    limit = w.requests if w.requests is not None else (1 << 30)
    samples: list[Sample] = []
    tasks: list[asyncio.Task] = []
    state = {"done": 0, "errors": 0}
    conn = aiohttp.TCPConnector(limit=0)
    t_run = time.perf_counter()

    def finished(s: Sample) -> None:
        samples.append(s)
        state["done"] += 1
        state["errors"] += 0 if s.ok else 1
        if progress:
            progress(state["done"], source.count, state["errors"], time.perf_counter() - t_run)

    def time_left() -> bool:
        return w.duration is None or time.perf_counter() - t_run < w.duration

    async with aiohttp.ClientSession(connector=conn) as session:
        async def one(req: Request) -> None:
            finished(await send_one(session, target, req, w, t_run))

        if w.rate is not None:  # open loop
            next_at = t_run
            while source.count < limit and time_left():
                req = source.next()
                delay = next_at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if not time_left():
                    break
                tasks.append(asyncio.create_task(one(req)))
                next_at += source.interarrival()
            await asyncio.gather(*tasks)
        else:  # closed loop
            async def worker() -> None:
                while source.count < limit and time_left():
                    await one(source.next())

            await asyncio.gather(*(worker() for _ in range(int(w.concurrency or 1))))
    wall = time.perf_counter() - t_run
    samples.sort(key=lambda s: s.index)
    return samples, wall


def run(target: Target, w: Workload, progress: Progress | None = None) -> tuple[list[Sample], float]:
    """Blocking wrapper around :func:`run_load`."""
    return asyncio.run(run_load(target, w, progress))


async def _get_json(url: str, headers: dict[str, str]) -> Any:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=10)) as r:
            return await r.json(content_type=None) if r.status == 200 else None


def discover_model(base_url: str, api_key: str | None) -> str | None:
    """The first model the endpoint lists in ``/v1/models`` (None if it lists none)."""
    try:
        doc = asyncio.run(_get_json(base_url.rstrip("/") + "/v1/models",
                                    Target(base_url, "", api_key).headers))
    except Exception as e:  # any network failure means "unknown"; the caller explains
        log.info("GET %s/v1/models failed: %s", base_url, e)
        return None
    data = doc.get("data") if isinstance(doc, dict) else None
    return str(data[0]["id"]) if data else None
