"""In-process checks of the runtime's request limits and the encoder registry's admission rules:
image headers are judged before any pixel is decoded, the prompt bound never exceeds the real
token count, deep JSON is a 400, and the registry takes only http(s) URLs with the cluster key.
"""

from __future__ import annotations

import asyncio
import io
import json
import math

import aiohttp
import pytest
from aiohttp import web
from PIL import Image

from epdctl.runtime.limits import (MAX_ASPECT_RATIO, Limits, check_image_sizes, image_size, image_tokens,
                                   max_token_bytes, text_bytes)
from epdctl.runtime.openai_api import ApiError, decode_json
from epdctl.runtime.servers.common import make_app
from epdctl.runtime.servers.registry import EncoderRegistry, bootstrap_app


def png(w: int, h: int, mode: str = "L") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (w, h)).save(buf, "PNG")
    return buf.getvalue()


def test_image_size_reads_only_the_header():
    data = png(6000, 6000)
    assert len(data) < 200_000  # a few KB on the wire, 36 MP once decoded
    assert image_size(1, data[:64]) == (6000, 6000)  # the header alone is enough


@pytest.mark.parametrize("sizes,code,contains", [
    ([(1, 300)], "invalid_image_shape", "image 1: 1x300 has an aspect ratio over 200"),
    ([(10, 10), (6000, 6000)], "image_too_large", "image 2: 6000x6000 = 36000000 pixels"),
    ([(4000, 4000)] * 3, "image_too_large", "images 1-3 hold 48000000 pixels"),
])
def test_pixel_limits(sizes, code, contains):
    with pytest.raises(ApiError) as exc:
        check_image_sizes(sizes, Limits())
    assert exc.value.status == 400 and exc.value.code == code and contains in exc.value.message


def test_aspect_ratio_limit_is_the_processors(bundle):
    """200:1 passes our check and the processor; 201:1 is refused by both (the processor with ValueError)."""
    check_image_sizes([(1, MAX_ASPECT_RATIO), (MAX_ASPECT_RATIO * 2, 2)], Limits())
    bundle.image_processor(images=[Image.new("RGB", (2, 400))], return_tensors="pt")
    with pytest.raises(ValueError, match="aspect ratio"):
        bundle.image_processor(images=[Image.new("RGB", (1, 201))], return_tensors="pt")
    with pytest.raises(ApiError):
        check_image_sizes([(1, 201)], Limits())


@pytest.mark.parametrize("w,h", [(64, 64), (1, 200), (300, 17), (1000, 30), (28, 28), (5, 900)])
def test_image_tokens_match_the_processor(bundle, w, h):
    feats = bundle.image_processor(images=[Image.new("RGB", (w, h))], return_tensors="pt")
    t, gh, gw = feats["image_grid_thw"][0].tolist()
    merge = bundle.merge_size
    assert image_tokens(w, h, bundle.image_processor, merge) == t * gh * gw // merge**2


@pytest.mark.parametrize("text", ["hello world", "a" * 5000, " " * 3000, "日本語のテキスト" * 100, "<|im_start|>" * 50,
                                  "\U0001F600" * 200])
def test_text_bound_never_exceeds_real_tokens(bundle, text):
    msgs = [{"role": "user", "content": [{"type": "text", "text": text}]}]
    real = len(bundle.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert math.ceil(text_bytes(msgs) / max_token_bytes(bundle.tokenizer)) <= real


@pytest.mark.parametrize("raw", [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 40 + b"1" + b"}" * 40,
                                 b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"])
def test_deep_json_is_a_400(raw):
    with pytest.raises(ApiError) as exc:
        decode_json(raw)
    assert exc.value.status == 400 and exc.value.code == "invalid_json"


def test_shallow_json_passes():
    assert decode_json(json.dumps({"messages": [{"content": [{"image_url": {"url": "x"}}]}]}).encode())


async def _registry_calls(api_key: str | None) -> list[tuple[str, int]]:
    reg = EncoderRegistry([], probe_interval=0, api_key=api_key)
    app = bootstrap_app(reg, make_app(64 * 1024))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    base = f"http://127.0.0.1:{port}"
    out = []
    try:
        async with aiohttp.ClientSession() as s:
            for url, headers in (("file:///etc/passwd", {}), ("not a url", {}), ("http://h:1/x?y", {}),
                                 ("gopher://h:70", {}), ("http://127.0.0.1:9", {}),
                                 ("http://127.0.0.1:9", {"Authorization": "Bearer wrong"}),
                                 ("http://127.0.0.1:9", {"Authorization": "Bearer s3cret"})):
                async with s.post(base + "/register_encoder_url", json={"url": url}, headers=headers) as r:
                    out.append((url, r.status))
            async with s.get(base + "/list_encoder_urls") as r:
                out.append(("list", r.status))
            async with s.post(base + "/register_encoder_url", data=b"x" * 100_000,
                              headers={"Content-Type": "application/json"}) as r:
                out.append(("big", r.status))
    finally:
        await runner.cleanup()
    return out


def test_registry_requires_the_key_and_http_urls():
    got = dict(asyncio.run(_registry_calls("s3cret")))
    assert got["file:///etc/passwd"] == 401 and got["list"] == 401  # the key is checked first
    got_open = asyncio.run(_registry_calls(None))
    statuses = [s for _, s in got_open]
    # without a key: bad URLs 400, the good one 200 (three times), listing 200, oversized body 413
    assert statuses == [400, 400, 400, 400, 200, 200, 200, 200, 413], got_open


def test_registry_with_key_accepts_only_the_right_bearer():
    got = asyncio.run(_registry_calls("s3cret"))
    assert [s for _, s in got] == [401, 401, 401, 401, 401, 401, 200, 401, 401], got
