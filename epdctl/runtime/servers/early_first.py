"""A decode answer whose first token came ahead of its KV.

The prefill has the first token before its KV leaves; it sends the token as a tiny message and
the decode streams it at once (smg relays only the decode's stream), instead of waiting for the
KV, its unpacking and an engine step that only re-emits that token. The sequence joins the
running batch when the KV lands, and the engine's re-emission of the token is dropped, so the
client sees every token once and exactly the tokens of the KV path. A first token that ends the
answer (EOS, max_tokens 1, a stop string) needs no KV at all: it is drained when it arrives. A
KV that fails after the token was streamed ends the stream with that error, in band.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any, Awaitable, Callable

from aiohttp import web

from epdctl.runtime.openai_api import check_context
from epdctl.runtime.servers.kv_receive import Received, kv_arrival, prefill_timings


class EarlyTokens:
    """The token queue ``respond`` reads: the early token, then (on the next ``get``) the KV is
    awaited, the sequence joins the engine, and the engine's tokens follow less its first."""

    def __init__(self, first: tuple[int, bool], join: Callable[[], Awaitable[asyncio.Queue]]):
        self._first: tuple[int, bool] | None = first
        self._join = join
        self._q: asyncio.Queue | None = None

    async def get(self) -> Any:
        if self._first is not None:
            item, self._first = self._first, None
            return item
        if self._q is None:
            self._q = await self._join()
            again = await self._q.get()  # the engine emits the prefill's token first: already streamed
            if isinstance(again, BaseException):
                return again
        return await self._q.get()


def stop_ids(params: Any, eos_token_ids: list[int]) -> set[int]:
    """The tokens that end a sequence: DecodeEngine.add's rule, so the early token ends an answer
    exactly when the engine would have ended it."""
    return set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))


async def stream_early(server: Any, request: web.Request, req: Any, got: Received,
                       t_arrival: float) -> web.StreamResponse:
    """Answer with ``got``'s first token now and the rest once ``got.kv`` lands (``server``: the
    DecodeServer). The KV is dropped when it arrives if the answer no longer needs it."""
    assert got.kv is not None
    room, kv = str(req.bootstrap_room), got.kv
    params = server.sampling(req)
    prompt_len = int(got.meta.get("prompt_len", 0))
    token = int(got.meta["token"])
    timings = prefill_timings(got.meta)
    timings["t_first_in"] = time.time()
    timings["t_decode_in"] = timings["t_first_in"] - (time.perf_counter() - t_arrival)
    seq_id = f"{room}-{uuid.uuid4().hex[:8]}"
    failed = False

    async with contextlib.AsyncExitStack() as stack:
        async def join() -> asyncio.Queue:
            nonlocal failed
            try:
                meta, tensors, wait_ms = await server.kv.rest(req, kv)
            except asyncio.CancelledError:  # the client left: drain the KV when it comes
                raise
            except BaseException:
                failed = True
                raise
            timings.update(kv_arrival(meta, got.wait_ms + wait_ms))
            server.gm.stage.observe(timings["kv_wait_ms"] / 1000.0, {"stage": "kv_wait"})
            _, q, kv_bytes = await stack.enter_async_context(server.sequence(room, meta, tensors, params, seq_id))
            timings["kv_bytes"] = kv_bytes
            return q

        try:
            check_context(prompt_len, params.max_tokens, server.info.context_length)
            done = token in stop_ids(params, server.bundle.eos_token_ids) or params.max_tokens <= 1
            return await server.gm.stream(request, req, seq_id=seq_id, tokens=EarlyTokens((token, done), join),
                                          prompt_len=prompt_len, loop=server.loop, used_tokens=server.used_tokens,
                                          detok=server._detok, stop_ids=set(params.stop_token_ids),
                                          t_arrival=t_arrival, timings=timings)
        finally:
            server.used_tokens.pop(seq_id, None)
            if failed:  # timed out, damaged, or its prefill is gone: nothing more will come
                if not kv.done():
                    kv.cancel()
                server.kv.transport.discard(room)
            else:  # used, or no longer needed: dropped when it arrives
                server.kv.drain(room, kv)
