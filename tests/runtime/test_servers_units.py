"""In-process checks of the server building blocks whose behaviour is hard to force through HTTP:
encoder batching (one vision pass for concurrent requests, a bad image fails only its request),
stop-string hold-back in streams, registry placement, Prometheus text.
"""

from __future__ import annotations

import asyncio

import pytest

from tiny_model import make_image

from epdctl.runtime.metrics import Registry, parse_text
from epdctl.runtime.openai_api import ApiError, parse_chat_request
from epdctl.runtime.openai_out import TextStream
from epdctl.runtime.servers.common import ModelThread
from epdctl.runtime.servers.encoder import EncodeBatcher
from epdctl.runtime.servers.registry import EncoderRegistry


def test_concurrent_encode_jobs_share_one_vision_pass(bundle):
    from epdctl.runtime.encoder_engine import VisionEncoder

    encoder = VisionEncoder(bundle, cache_mb=16)

    async def go():
        batcher = EncodeBatcher(encoder, ModelThread("t"), max_batch_images=32, wait_s=0.5)
        batcher.start()
        try:
            jobs = [[make_image(40)], [make_image(41), make_image(42)], [make_image(43)]]
            results = await asyncio.gather(*(batcher.encode(j) for j in jobs))
            bad = await asyncio.gather(batcher.encode([make_image(44)]), batcher.encode([b"garbage"]),
                                       return_exceptions=True)
            return batcher.batches, results, bad
        finally:
            await batcher.stop()

    batches, results, bad = asyncio.run(go())
    assert [len(r) for r in results] == [1, 2, 1]
    # one pass for the 3 jobs; the mixed batch fails while decoding (before any pass), then the good
    # job is re-run alone (one pass) and the garbage one fails alone
    assert encoder.stats["vision_passes"] == 2
    assert batches == 1 + 3  # the mixed batch, then each of its two jobs on its own
    assert len(bad[0]) == 1 and not bad[0][0].cached
    assert "cannot decode" in str(bad[1])


@pytest.mark.parametrize("stop", [["cd"], ["xyz", "de"], ["d"]])
def test_text_stream_never_leaks_part_of_a_stop_string(stop):
    pieces = ["a", "b", "c", "d", "e", "f"]
    stream = TextStream(lambda ids: "".join(pieces[i] for i in ids), stop)
    shown = ""
    for i in range(len(pieces)):
        shown += stream.push(i)
        if stream.stopped:
            break
    cut = min("abcdef".find(s) for s in stop if s in "abcdef")
    assert stream.stopped and shown == "abcdef"[:cut] == stream.text


def test_text_stream_flushes_held_text_at_the_end():
    stream = TextStream(lambda ids: "abc"[: len(ids)], ["cz"])
    shown = "".join(stream.push(i) for i in range(3))
    assert shown == "ab" and stream.finish() == "c" and not stream.stopped


def test_registry_affinity_and_load_fallback():
    reg = EncoderRegistry(["http://e0:1", "http://e1:1", "http://e2:1"], probe_interval=0)
    owners = {d: reg.pick(d).url for d in (f"digest{i}" for i in range(30))}
    assert len(set(owners.values())) == 3  # spread over every encoder
    assert all(reg.pick(d).url == u for d, u in owners.items())  # and stable per image
    busy = owners["digest0"]
    reg.encoders[busy].inflight = 10
    assert reg.pick("digest0").url != busy  # an overloaded owner loses the image to the least loaded
    for url in list(reg.encoders):
        for _ in range(3):
            reg.mark_failed(url)
    with pytest.raises(ApiError) as err:
        reg.pick("digest0")
    assert err.value.status == 503


def test_prometheus_text():
    reg = Registry("t")
    reg.counter("req_total", "requests").inc(2, {"status": "200"})
    h = reg.histogram("lat_seconds", "latency", buckets=(0.1, 1.0))
    h.observe(0.5)
    reg.gauge("depth", "queue", lambda: 3)
    text = reg.render()
    values = parse_text(text)
    assert "# TYPE t_lat_seconds histogram" in text
    assert values['t_req_total{status="200"}'] == 2
    assert values['t_lat_seconds_bucket{le="0.1"}'] == 0 and values['t_lat_seconds_bucket{le="1"}'] == 1
    assert values['t_lat_seconds_bucket{le="+Inf"}'] == 1 and values["t_depth"] == 3


def test_parse_replaces_image_parts_and_keeps_order():
    body = {"model": "m", "stream": True, "max_tokens": 5, "stop": "x", "bootstrap_room": 7,
            "bootstrap_host": "h", "bootstrap_port": 9, "logprobs": False,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                      {"type": "image_url", "image_url": {"url": "data:1"}},
                                                      {"type": "image_url", "image_url": "data:2"}]}]}
    req = parse_chat_request(body, "m", max_images=2, require_room=True)
    assert req.image_refs == ["data:1", "data:2"] and req.stop == ["x"] and req.bootstrap_room == 7
    assert req.messages[0]["content"] == [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "image"}]


async def _health_server(delay: float):  # type: ignore[no-untyped-def]
    """A stand-in encoder on a free port whose /health answers 200 after ``delay`` seconds."""
    from aiohttp import web

    async def health(request: web.Request) -> web.Response:
        await asyncio.sleep(delay)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]


def test_registry_rechecks_evicted_encoders_before_answering_no_encoder():
    """An encoder evicted by the probe loop that answers /health again is probed and picked at
    once, not refused with 503 no_encoder until the loop's next round; one still down is 503."""
    import aiohttp

    async def go():
        runner, port = await _health_server(0.0)
        back, down = f"http://127.0.0.1:{port}", "http://127.0.0.1:9"
        reg = EncoderRegistry([back, down], probe_interval=3600)
        async with aiohttp.ClientSession() as session:
            reg.start(session)
            try:
                for s in reg.encoders.values():
                    s.healthy, s.failures = False, 3  # both evicted by earlier failed probes
                with pytest.raises(ApiError):
                    reg.pick("d")  # the plain pick still answers from the last round
                picked = (await reg.pick_checked("d")).url
                reg.encoders[back].healthy = False
                with pytest.raises(ApiError) as err:
                    await reg.pick_checked("d", exclude={back})
            finally:
                await reg.stop()
        await runner.cleanup()
        return picked, err.value

    picked, err = asyncio.run(go())
    assert picked.startswith("http://127.0.0.1:") and not picked.endswith(":9")
    assert err.status == 503 and err.code == "no_encoder"


def test_a_busy_encoder_that_misses_probes_but_answers_requests_stays_admitted():
    """A /health slower than the probe's deadline (an encoder on starved cores) fails each probe;
    three in a row evict it, unless it answered a request in between, which breaks the row."""
    import aiohttp

    async def go():
        runner, port = await _health_server(0.5)
        busy, silent = f"http://127.0.0.1:{port}", f"http://localhost:{port}"
        reg = EncoderRegistry([busy, silent], probe_interval=0, probe_timeout=0.1)
        rounds = []
        async with aiohttp.ClientSession() as session:
            for _ in range(5):
                await reg.probe_all(session)
                reg.answered(busy)  # requests to it were answered between the probes
                rounds.append({u: (s.healthy, s.failures) for u, s in reg.encoders.items()})
        await runner.cleanup()
        return busy, silent, rounds, reg

    busy, silent, rounds, reg = asyncio.run(go())
    assert all(r[busy] == (True, 0) for r in rounds)
    assert [r[silent] for r in rounds[:3]] == [(True, 1), (True, 2), (False, 3)]
    assert reg.healthy_urls() == [busy]


def test_a_client_gone_before_the_answer_is_no_server_error(caplog):
    """Writing to a connection the client closed (a decode that gave up on /kv/route) is passed to
    aiohttp, which drops it quietly; a reset of a call the handler made (its own client's
    connection still open) is a logged 500 as before."""
    from unittest import mock

    from aiohttp.client_exceptions import ClientConnectionResetError
    from aiohttp.test_utils import make_mocked_request

    from epdctl.runtime.servers.common import error_middleware

    async def reset(request):
        raise ClientConnectionResetError("Cannot write to closing transport")

    def request(closing: bool):
        transport = mock.Mock()
        transport.is_closing.return_value = closing
        return make_mocked_request("POST", "/kv/route", transport=transport)

    with pytest.raises(ConnectionResetError):
        asyncio.run(error_middleware(request(closing=True), reset))
    assert "unhandled error" not in caplog.text
    resp = asyncio.run(error_middleware(request(closing=False), reset))
    assert resp.status == 500 and "unhandled error in POST /kv/route" in caplog.text


def test_a_kv_wait_left_behind_ends_without_never_retrieved_errors():
    """The decode's KV wait that outlives its request (the client left first) times out later;
    its error is marked seen, so asyncio does not log 'Task exception was never retrieved'."""
    import gc

    from epdctl.runtime.servers.kv_receive import _retrieved

    async def go(mark: bool) -> list:
        seen: list = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: seen.append(ctx["message"]))

        async def kv_timeout() -> None:
            raise TimeoutError

        task = asyncio.create_task(kv_timeout())
        if mark:
            task.add_done_callback(_retrieved)
        await asyncio.sleep(0.01)
        del task
        gc.collect()
        return seen

    assert asyncio.run(go(mark=True)) == []
    assert asyncio.run(go(mark=False)) == ["Task exception was never retrieved"]
