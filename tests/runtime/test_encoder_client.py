"""The prefill's encoder client over a real HTTP server and real ZMQ transports: it goes on as
soon as the embeddings arrive, and an error answer that comes first still fails the call.

The stand-in encoder speaks the real `/encode` contract (JSON key/reply_to/images in, embeddings
on the transport under the key, then a JSON answer) with embeddings of fixed values, so each
test decides when the answer goes out relative to the embeddings.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from typing import Awaitable, Callable

import aiohttp
import pytest
import torch
from aiohttp import web

from epdctl.runtime import wire
from epdctl.runtime.encoder_engine import EncodedImage
from epdctl.runtime.openai_api import ApiError
from epdctl.runtime.servers.encoder_client import EncoderClient
from epdctl.runtime.servers.registry import EncoderRegistry
from epdctl.runtime.transports import open_transport

Handler = Callable[[web.Request, object], Awaitable[web.Response]]


def embeds_for(images_b64: list[str]) -> tuple[dict, dict[str, torch.Tensor]]:
    """Embeddings as the real encoder labels them (sha256 of the image bytes); image i is all i."""
    digests = [hashlib.sha256(base64.b64decode(b)).hexdigest() for b in images_b64]
    return wire.embeds_to_tensors([EncodedImage(digest=d, embeds=torch.full((4, 8), float(i)), grid_thw=(1, 4, 4),
                                                cached=False) for i, d in enumerate(digests)])


async def with_encoder(handler: Handler, body: Callable[[EncoderClient, dict], Awaitable[None]]) -> None:
    """Run ``body(client, state)`` against a stand-in encoder served by ``handler``."""
    enc_transport = open_transport("zmq", "127.0.0.1", timeout=5)
    pre_transport = open_transport("zmq", "127.0.0.1", timeout=5)
    await enc_transport.start()
    await pre_transport.start()
    app = web.Application()
    async def encode(request: web.Request) -> web.Response:
        return await handler(request, enc_transport)

    app.router.add_post("/encode", encode)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    session = aiohttp.ClientSession()
    registry = EncoderRegistry([f"http://127.0.0.1:{port}"], probe_interval=0)
    client = EncoderClient(registry, session, pre_transport, wire, timeout=5)
    try:
        await body(client, {"registry": registry})
    finally:
        await client.close()
        await session.close()
        await runner.cleanup()
        await enc_transport.close()
        await pre_transport.close()


def test_embeddings_are_used_before_the_encoder_answers():
    answered = asyncio.Event()
    release = asyncio.Event()

    async def handler(request: web.Request, transport) -> web.Response:
        body = await request.json()
        meta, tensors = embeds_for(body["images"])
        await transport.send(body["reply_to"], body["key"], meta, tensors)
        await release.wait()  # the answer is held back until the test lets it go
        answered.set()
        return web.json_response({"key": body["key"], "num_images": len(body["images"])})

    async def body(client: EncoderClient, state: dict) -> None:
        enc = next(iter(state["registry"].encoders.values()))
        enc.failures = 2  # two probes missed while it was busy
        encoded, nbytes = await client.encode([b"img-a", b"img-b", b"img-a"])
        assert enc.failures == 0 and enc.healthy  # its answer broke the row
        assert not answered.is_set()  # we went on before the encoder's HTTP answer
        assert [float(e.embeds[0, 0]) for e in encoded] == [0.0, 1.0, 0.0]  # duplicates encoded once
        assert nbytes == 2 * 4 * 8 * 4 and len(client._background) == 1
        release.set()
        await asyncio.wait_for(answered.wait(), 5)
        for _ in range(50):
            if not client._background:
                break
            await asyncio.sleep(0.01)
        assert not client._background  # the late answer was read and forgotten
        assert state["registry"].encoders[next(iter(state["registry"].encoders))].failures == 0

    asyncio.run(with_encoder(handler, body))


def test_an_error_answer_before_any_embeddings_fails_the_call():
    async def handler(request: web.Request, transport) -> web.Response:
        await request.json()
        return web.json_response({"error": {"message": "image 1: 9000x9000 is too large"}}, status=400)

    async def body(client: EncoderClient, state: dict) -> None:
        enc = next(iter(state["registry"].encoders.values()))
        enc.failures = 2
        with pytest.raises(ApiError) as err:
            await client.encode([b"img"])
        assert err.value.status == 400 and "9000x9000" in err.value.message
        assert not client._background
        assert enc.failures == 0  # a rejection is an answer: the encoder is alive

    asyncio.run(with_encoder(handler, body))


def test_a_dead_encoder_is_reported_unavailable():
    async def handler(request: web.Request, transport) -> web.Response:
        await request.json()
        return web.json_response({"error": {"message": "vision tower crashed"}}, status=500)

    async def body(client: EncoderClient, state: dict) -> None:
        with pytest.raises(ApiError) as err:
            await client.encode([b"img"])
        assert err.value.status == 503 and "vision tower crashed" in err.value.message
        assert next(iter(state["registry"].encoders.values())).failures >= 1

    asyncio.run(with_encoder(handler, body))


def test_the_trace_gets_the_slowest_groups_stamps():
    import time

    async def handler(request: web.Request, transport) -> web.Response:
        body = await request.json()
        meta, tensors = embeds_for(body["images"])
        now = time.time()
        meta["trace"] = {"t_enc_in": now - 0.002, "t_enc_send": now, "junk": "x", "flag": True}
        await transport.send(body["reply_to"], body["key"], meta, tensors)
        return web.json_response({"key": body["key"], "num_images": len(body["images"])})

    async def body(client: EncoderClient, state: dict) -> None:
        trace: dict[str, float] = {}
        t0 = time.time()
        await client.encode([b"img-a", b"img-b"], trace)
        assert set(trace) == {"t_enc_in", "t_enc_send", "t_emb_in"}  # non-numbers are not stamps
        assert t0 - 0.01 <= trace["t_enc_in"] <= trace["t_enc_send"] <= trace["t_emb_in"] <= time.time()

    asyncio.run(with_encoder(handler, body))


def _inline_encoder(damage: Callable[[bytes], bytes] = lambda b: b) -> Handler:
    """An encoder that answers as the real one does when the embeddings fit ``inline_max_bytes``
    (encode_api.py): the packed embeddings are the answer; ``damage`` alters the body first."""
    from epdctl.runtime.servers.encode_api import INLINE_TYPE, inline_body

    async def handler(request: web.Request, transport) -> web.Response:
        body = await request.json()
        meta, tensors = embeds_for(body["images"])
        assert body["inline_max_bytes"] >= sum(t.numel() * t.element_size() for t in tensors.values())
        return web.Response(body=damage(inline_body(wire.pack(meta, tensors))), content_type=INLINE_TYPE)

    return handler


def test_small_embeddings_come_back_as_the_answer_itself_without_the_transport():
    async def body(client: EncoderClient, state: dict) -> None:
        received = client.transport.stats["transfers_received"]
        encoded, nbytes = await client.encode([b"img-a", b"img-b", b"img-a"])
        assert [float(e.embeds[0, 0]) for e in encoded] == [0.0, 1.0, 0.0]
        assert [e.embeds.shape for e in encoded] == [torch.Size([4, 8])] * 3 and nbytes == 2 * 4 * 8 * 4
        assert client.transport.stats["transfers_received"] == received  # nothing came over the transport
        assert client.inline["bytes_received"] > nbytes  # counted as received all the same (header included)
        assert not client._background

    asyncio.run(with_encoder(_inline_encoder(), body))


@pytest.mark.parametrize("how", ["flipped", "truncated", "extra"])
def test_a_damaged_inline_answer_fails_the_call(how: str):
    from epdctl.runtime.errors import TransferError

    def damage(b: bytes) -> bytes:
        if how == "flipped":  # the last byte is tensor data: its checksum no longer matches
            return b[:-1] + bytes([b[-1] ^ 0x40])
        return b[:-3] if how == "truncated" else b + b"\0"

    async def body(client: EncoderClient, state: dict) -> None:
        with pytest.raises(TransferError):
            await client.encode([b"img-a", b"img-b"])

    asyncio.run(with_encoder(_inline_encoder(damage), body))


def test_the_encode_body_checks_inline_max_bytes():
    from epdctl.runtime.limits import Limits
    from epdctl.runtime.servers.encode_api import parse_encode

    ok = {"key": "k", "reply_to": "zmq+tcp://x:1", "images": [base64.b64encode(b"png").decode()]}
    limits = Limits(max_images_per_request=4)
    assert parse_encode(ok, limits)[3] == 0  # an older prefill: the transport, as before
    assert parse_encode({**ok, "inline_max_bytes": 4096}, limits)[3] == 4096
    for bad in (-1, "1024", True, 1.5):
        with pytest.raises(ApiError) as err:
            parse_encode({**ok, "inline_max_bytes": bad}, limits)
        assert err.value.status == 400 and "inline_max_bytes" in err.value.message
