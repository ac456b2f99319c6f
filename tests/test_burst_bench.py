"""benchmarks/bench_burst_isolation.py's client: the token gaps it reads from a real SSE stream.

A real aiohttp server streams chunks written by the runtime's own SSE writer (openai_out), some
carrying several tokens (tokens that added no text ride on the next chunk, as respond.py does):
the bench counts every chunk with text as a gap, and a gap before a one-token chunk as one step.
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

import bench_burst_isolation as bench

from epdctl.runtime import openai_out as oo

# (text, token ids) per chunk after the role chunk; the third carries three tokens
CHUNKS = [("A", [11]), (" red", [12]), (" circle", [13, 14, 15]), (".", [16])]


async def serve(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(oo.sse(oo.chunk("c", "m", 1, {"role": "assistant", "content": ""})))
    for text, ids in CHUNKS:
        await asyncio.sleep(0.01 * len(ids))
        await resp.write(oo.sse(oo.chunk("c", "m", 1, {"content": text}, token_ids=ids)))
    await resp.write(oo.sse(oo.chunk("c", "m", 1, {}, "length", oo.usage(3, 6))))
    await resp.write(oo.SSE_DONE)
    return resp


def test_gaps_and_one_token_gaps_from_a_stream():
    async def main() -> tuple[float | None, list[float], list[list[float]], list[float]]:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", serve)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        stamps: list[list[float]] = []
        one: list[float] = []
        spans: list[int] = []
        try:
            async with aiohttp.ClientSession() as session:
                ttft, gaps = await bench.stream(session, f"http://127.0.0.1:{port}/v1/chat/completions",
                                                {"model": "m"}, stamps, one, spans)
        finally:
            await runner.cleanup()
        assert spans == [1, 3, 1]  # each gap's decode steps: the token ids its chunk carries
        return ttft, gaps, stamps, one

    ttft, gaps, stamps, one = asyncio.run(main())
    assert ttft is not None and ttft > 0
    assert len(stamps) == 1 and len(stamps[0]) == len(CHUNKS) and len(gaps) == len(CHUNKS) - 1
    # gaps before " red" and "." carry one token each; the one before " circle" three
    assert len(one) == 2 and one == [gaps[0], gaps[2]]


def test_step_shares():
    assert bench.step_shares([1, 1, 2, 3, 4, 6, 1, 1]) == {"1": 0.5, "2": 0.125, "3": 0.125, "4+": 0.25}
    assert bench.step_shares([]) == {"1": 0.0, "2": 0.0, "3": 0.0, "4+": 0.0}


def test_cpu_lists():
    assert bench._cpu_set("0") == {0} and bench._cpu_set("0-2,5") == {0, 1, 2, 5}
