"""The prefill's first token ahead of its KV (kv_handoff.py -> kv_receive.py -> early_first.py) and small
embeddings inline in the encoder's answer (encode_api.py):
real prefill and decode processes driven the way smg drives them, and a real decode facing a
prefill played by the test with the real bootstrap server and transport, to make the KV come
late, fail, or never be needed. Tokens must stay exactly those of one-process ``generate()``.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import aiohttp
from aiohttp import web

from servers_cluster import (D, MODEL, P, PB, cluster, data_url, expected, get_text, model_dir, pd,  # noqa: F401
                             ref_bundle, run)
from tiny_model import make_image
from worker_procs import Worker, chat_body, metric, pd_call, sse_events, with_room

from epdctl.runtime.servers.bootstrap import KVBootstrap
from epdctl.runtime.transports import open_transport


def test_the_first_token_is_streamed_before_the_kv_lands_and_the_tokens_are_exact(cluster, ref_bundle):
    pngs = [make_image(3), make_image(4), make_image(5)]
    want = expected(ref_bundle, pngs)
    for stream in (True, False):
        out = pd(chat_body(MODEL, [data_url(p) for p in pngs], max_tokens=10, stream=stream, return_token_ids=True))
        if stream:
            chunks = out[:-1]
            ids = [t for c in chunks for t in c["choices"][0].get("token_ids", [])]
            timings = chunks[-1]["timings"]
        else:
            ids, timings = out["choices"][0]["token_ids"], out["timings"]
        assert ids == want
        # the decode had the token before the KV, and counted its first token from the token
        assert timings["t_route"] <= timings["t_first_in"] <= timings["t_kv_in"], timings
        assert timings["kv_bytes"] > 0


def test_a_first_token_that_ends_the_answer_needs_no_kv(cluster, ref_bundle):
    pngs = [make_image(6)]
    want = expected(ref_bundle, pngs, max_tokens=1)
    url = f"http://127.0.0.1:{D}/metrics"
    before = run(get_text(url))
    late = metric(before, 'epd_decode_kv_receive_total{outcome="late"}')
    came = metric(before, "epd_decode_transport_transfers_received_total")  # (the first token is no transfer)
    out = pd(chat_body(MODEL, [data_url(pngs[0])], max_tokens=1, stream=True, return_token_ids=True))
    assert [t for c in out[:-1] for t in c["choices"][0].get("token_ids", [])] == want
    assert out[-2]["choices"][0]["finish_reason"] in ("length", "stop")

    async def drained() -> None:  # the KV still came and was dropped, not kept: taken late by the drain,
        for _ in range(100):      # or (a fast hand-off) in before the answer ended, then discarded
            text = await get_text(url)
            if metric(text, 'epd_decode_kv_receive_total{outcome="late"}') > late or \
                    metric(text, "epd_decode_transport_transfers_received_total") > came:
                return
            await asyncio.sleep(0.1)
        raise AssertionError("the unneeded KV was never drained")

    run(drained())


def test_a_decode_pinned_to_one_core_streams_exact_tokens_to_concurrent_clients(cluster, ref_bundle, model_dir,
                                                                               tmp_path):
    """``--cpus`` of one core: the engine waits for each step's tokens to be written and the GIL
    hands over sooner (engine_loop.py); concurrent streams still get exactly their tokens."""
    port = 33650  # fixed, beside the cluster's 336xx: a port bind(0) found free was taken before the worker bound it (CI)
    one = Worker("decode", ["--model-path", str(model_dir), "--served-model-name", MODEL, "--port", str(port),
                            "--kv-timeout", "60", "--cpus", "0"], tmp_path, "decode-one-core")
    try:
        one.wait_ready()
        sets = [[make_image(7)], [make_image(8), make_image(9)], [make_image(10)]]
        bodies = [with_room(chat_body(MODEL, [data_url(p) for p in pngs], max_tokens=10, stream=True,
                                      return_token_ids=True), PB) for pngs in sets]

        async def all_at_once() -> list:
            return await asyncio.gather(*(pd_call(f"http://127.0.0.1:{P}", one.url, b) for b in bodies))

        for pngs, ((ps, _), (ds, dbody)) in zip(sets, run(all_at_once())):
            assert ps == 200 and ds == 200, dbody
            events = sse_events(dbody)
            assert [t for c in events[:-1] for t in c["choices"][0].get("token_ids", [])] == expected(ref_bundle, pngs)
    finally:
        one.stop()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _played_prefill(room: int, play: Any) -> list[Any]:
    """Serve a KV bootstrap like a prefill's, post a streamed chat to the real decode, and let
    ``play(boot, transport, reply_to, events)`` act as the prefill; the SSE events the decode sent."""
    port, boot = _port(), KVBootstrap()
    runner = web.AppRunner(boot.app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    transport = open_transport("zmq", "127.0.0.1")
    await transport.start()
    body = {**chat_body(MODEL, [], text="hi", max_tokens=6, stream=True, return_token_ids=True),
            "bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": room}
    events: list[Any] = []
    try:
        async with aiohttp.ClientSession() as s:
            async def client() -> None:  # the decode answers its headers with the first token
                async with s.post(f"http://127.0.0.1:{D}/v1/chat/completions", json=body) as resp:
                    assert resp.status == 200, await resp.text()
                    async for line in resp.content:
                        if line.startswith(b"data: "):
                            payload = line[6:].strip()
                            events.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))

            reader = asyncio.create_task(client())
            reply_to = await boot.wait_route(str(room), 30)
            assert boot.wants_first(str(room)), "a chat decode asks for the first token ahead of the KV"
            await play(boot, transport, reply_to, events)
            await asyncio.wait_for(reader, 30)
    finally:
        await transport.close()
        await runner.cleanup()
    return events


async def _until(events: list[Any], pred: Any) -> None:
    for _ in range(300):
        if any(pred(e) for e in events):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the decode never streamed it: {events}")


def _has_token(e: Any) -> bool:
    return isinstance(e, dict) and bool(e.get("choices") and e["choices"][0].get("token_ids"))


def test_a_kv_that_fails_after_the_first_token_ends_the_stream_with_an_error(cluster, ref_bundle):
    token = ref_bundle.tokenizer.encode("Hello")[0]
    assert token not in ref_bundle.eos_token_ids

    async def play(boot, transport, reply_to, events) -> None:
        meta = {"kind": "first", "token": token, "prompt_len": 5, "timings": {}, "sent_at": 0.0}
        assert boot.give_first("901", meta) is not None
        await _until(events, _has_token)  # streamed while the KV is still owed
        await transport.send(reply_to, "901", {"kind": "error", "status": 502, "message": "the KV hand-off failed: "
                                               "played", "code": "kv_handoff_failed", "type": "server_error"}, {})

    events = run(_played_prefill(901, play))
    assert [t for e in events if _has_token(e) for t in e["choices"][0]["token_ids"]] == [token]
    errors = [e for e in events if isinstance(e, dict) and "error" in e]
    assert len(errors) == 1 and "KV hand-off failed" in errors[0]["error"]["message"], events
    assert events[-1] == "[DONE]"


def test_an_eos_first_token_finishes_at_once_and_its_kv_is_dropped_on_arrival(cluster, ref_bundle):
    eos = ref_bundle.eos_token_ids[0]
    url = f"http://127.0.0.1:{D}/metrics"

    async def play(boot, transport, reply_to, events) -> None:
        meta = {"kind": "first", "token": eos, "prompt_len": 5, "timings": {}, "sent_at": 0.0}
        assert boot.give_first("902", meta) is not None
        await _until(events, lambda e: e == "[DONE]")  # answered without any KV
        before = metric(await get_text(url), 'epd_decode_kv_receive_total{outcome="late"}')
        await transport.send(reply_to, "902", {"kind": "kv", "prompt_len": 5}, {})  # the KV, now unneeded
        for _ in range(100):
            if metric(await get_text(url), 'epd_decode_kv_receive_total{outcome="late"}') > before:
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the KV of a finished answer was not drained")

    events = run(_played_prefill(902, play))
    finish = [e["choices"][0]["finish_reason"] for e in events if isinstance(e, dict) and e.get("choices")]
    assert finish[-1] == "stop" and events[-1] == "[DONE]"


def test_the_real_encoder_answers_small_embeddings_inline(cluster):
    from servers_cluster import E0

    url = f"http://127.0.0.1:{E0}/metrics"
    before = run(get_text(url))
    pd(chat_body(MODEL, [data_url(make_image(11))], max_tokens=2))
    after = run(get_text(url))
    assert metric(after, "epd_encoder_inline_answers_total") == metric(before, "epd_encoder_inline_answers_total") + 1
    # counted as inline bytes, apart from the transport's (a canary must know which path moved them)
    assert metric(after, "epd_encoder_inline_bytes_sent_total") > metric(before, "epd_encoder_inline_bytes_sent_total")
    assert metric(after, "epd_encoder_transport_bytes_sent_total") == metric(before, "epd_encoder_transport_bytes_sent_total")


def test_force_transport_sends_small_embeddings_over_the_transport(cluster, ref_bundle):
    """``epd_force_transport`` (the pair canary's requests): the same small embeddings take the E->P
    transport, and the answer is the same tokens as the inline path's."""
    from servers_cluster import E0, P

    def counters() -> tuple[float, ...]:
        enc, pre = run(get_text(f"http://127.0.0.1:{E0}/metrics")), run(get_text(f"http://127.0.0.1:{P}/metrics"))
        return (metric(enc, "epd_encoder_transport_bytes_sent_total"), metric(enc, "epd_encoder_inline_answers_total"),
                metric(pre, "epd_prefill_transport_bytes_received_total"),
                metric(pre, "epd_prefill_inline_bytes_received_total"))

    png = make_image(12)
    before = counters()
    forced = pd({**chat_body(MODEL, [data_url(png)], max_tokens=4, return_token_ids=True), "epd_force_transport": True})
    after = counters()
    assert after[0] > before[0] and after[2] > before[2]   # over the transport, both ends counted
    assert after[1] == before[1] and after[3] == before[3]  # nothing inline
    assert forced["choices"][0]["token_ids"] == expected(ref_bundle, [png], max_tokens=4)
