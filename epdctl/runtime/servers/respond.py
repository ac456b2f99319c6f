"""Token queue → OpenAI answer: one JSON ``chat.completion`` or an SSE stream.

Shared by the decode and colocated workers so both answer byte-for-byte the same way. A
stop string, a finished sequence or a client that went away all end in the same place:
the sequence is aborted in the engine (its KV freed) exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from aiohttp import web

from epdctl.runtime import openai_api as oa
from epdctl.runtime import openai_out as oo
from epdctl.runtime.servers.common import json_response

log = logging.getLogger(__name__)


@dataclass
class Generation:
    """What the responder needs to know about one running sequence."""

    seq_id: str
    req: oa.ChatRequest
    tokens: asyncio.Queue
    prompt_len: int
    stop_ids: set[int]
    decode: Callable[[list[int]], str]
    abort: Callable[[str], None]
    t_arrival: float                      # perf_counter() when the client request arrived
    timings: dict[str, float] = field(default_factory=dict)  # filled by the worker (encode/prefill/kv)
    on_token: Callable[[int], None] | None = None
    token_ids: list[int] = field(default_factory=list)  # every generated token, up to the finish


@dataclass
class Outcome:
    text: str
    finish_reason: str
    completion_tokens: int
    ttft_s: float | None
    tpot_s: float | None
    timings: dict[str, float]


async def _tokens(gen: Generation, stream: oo.TextStream) -> AsyncIterator[tuple[str, str | None]]:
    """Yield (delta_text, finish_reason|None) until the sequence ends."""
    while True:
        item = await gen.tokens.get()
        if isinstance(item, BaseException):
            raise oa.ApiError(500, f"decode failed: {type(item).__name__}: {item}", "decode_failed", "server_error")
        token, done = item
        gen.token_ids.append(token)
        if gen.on_token is not None:
            gen.on_token(token)
        if done and token in gen.stop_ids:
            yield stream.finish(), "stop"
            return
        delta = stream.push(token)
        if stream.stopped:
            gen.abort(gen.seq_id)
            yield delta, "stop"
            return
        if done:
            yield delta + stream.finish(), "length"
            return
        yield delta, None


def _finalize(gen: Generation, stream: oo.TextStream, finish: str, first: float | None, last: float) -> Outcome:
    now = time.perf_counter()
    n = len(gen.token_ids)
    ttft = None if first is None else first - gen.t_arrival
    tpot = (last - first) / (n - 1) if first is not None and n > 1 else None
    timings = dict(gen.timings)
    timings["ttft_ms"] = (ttft or 0.0) * 1000.0
    timings["decode_ms"] = ((last - first) * 1000.0) if first is not None else 0.0
    timings["total_ms"] = (now - gen.t_arrival) * 1000.0
    return Outcome(stream.text, finish, n, ttft, tpot, timings)


async def respond(request: web.Request, gen: Generation) -> tuple[web.StreamResponse, Outcome]:
    """Answer the client; on any exit path that is not a normal finish the sequence is aborted."""
    stream = oo.TextStream(gen.decode, gen.req.stop)
    cid = oo.new_completion_id()
    model = gen.req.model
    first: float | None = None
    last = time.perf_counter()
    finished = False
    try:
        if not gen.req.stream:
            finish = "length"
            async for _, reason in _tokens(gen, stream):
                last = time.perf_counter()
                first = first or last
                if reason:
                    finish = reason
            finished = True
            out = _finalize(gen, stream, finish, first, last)
            body = oo.chat_completion(cid, model, out.text, finish, oo.usage(gen.prompt_len, out.completion_tokens),
                                      out.timings, gen.token_ids if gen.req.return_token_ids else None)
            return json_response(body), out
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        created = int(time.time())
        await resp.write(oo.sse(oo.chunk(cid, model, created, {"role": "assistant", "content": ""})))
        sent = 0

        def new_ids() -> list[int] | None:
            nonlocal sent
            if not gen.req.return_token_ids:
                return None
            ids, sent = gen.token_ids[sent:], len(gen.token_ids)
            return ids

        try:
            async for delta, reason in _tokens(gen, stream):
                last = time.perf_counter()
                first = first or last
                if delta:
                    await resp.write(oo.sse(oo.chunk(cid, model, created, {"content": delta}, token_ids=new_ids())))
                if reason:
                    finished = True
                    out = _finalize(gen, stream, reason, first, last)
                    await resp.write(oo.sse(oo.chunk(cid, model, created, {}, reason,
                                                     oo.usage(gen.prompt_len, out.completion_tokens), out.timings,
                                                     token_ids=new_ids())))
                    break
            else:
                raise oa.ApiError(500, "the sequence ended without a finish", "aborted", "server_error")
        except oa.ApiError as err:  # headers are sent: report in-band, as OpenAI does
            log.error("stream %s failed: %s", gen.seq_id, err.message)
            await resp.write(oo.sse(err.body()))
            out = Outcome(stream.text, "error", len(gen.token_ids), None, None, dict(gen.timings))
        await resp.write(oo.SSE_DONE)
        await resp.write_eof()
        return resp, out
    except (ConnectionResetError, asyncio.CancelledError):
        log.info("client went away during %s; aborting it", gen.seq_id)
        raise
    finally:
        if not finished:
            gen.abort(gen.seq_id)
