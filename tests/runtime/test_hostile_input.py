"""Hostile input against real encoder/prefill/decode processes: every limit answers a 4xx at the
earliest stage that can know (body bytes, JSON depth, prompt bytes, image headers), the encoder
answers 400 for an image its processor would refuse, the prefill passes that on as a 400 without
evicting the encoder, remote image fetches go only to allowed hosts, and the registry takes only
http(s) URLs with the cluster's API key.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import time

import aiohttp
import pytest
from PIL import Image

from tiny_model import make_image
from worker_procs import Worker, chat_body, post, start_all, with_room

E, P, PB, PEB, D = 33800, 33810, 33811, 33812, 33820
MODEL = "tiny-vlm"
BODY_LIMIT = 2_000_000
KEY_ENV, KEY = "EPD_TEST_CLUSTER_KEY", "k-" + os.urandom(8).hex()


def png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("L", (w, h), 128).save(buf, "PNG")
    return buf.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def workers(tiny_ckpt, tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    m = ["--model-path", str(tiny_ckpt)]
    os.environ[KEY_ENV] = KEY  # inherited by the workers; only the variable's name is on their command lines
    try:
        ws = {
            # the encoder's pixel limit is stricter than the prefill's: its own 400s get exercised
            "e": Worker("encoder", [*m, "--port", str(E), "--register-urls", f"http://127.0.0.1:{PEB}",
                                    "--api-key-env", KEY_ENV, "--max-image-pixels", "20000"], logs),
            "p": Worker("prefill", [*m, "--served-model-name", MODEL, "--port", str(P), "--bootstrap-port", str(PB),
                                    "--encoder-bootstrap-port", str(PEB), "--kv-timeout", "3",
                                    "--max-body-bytes", str(BODY_LIMIT), "--api-key-env", KEY_ENV,
                                    "--encoder-probe-interval", "0.5"], logs),
            "d": Worker("decode", [*m, "--served-model-name", MODEL, "--port", str(D), "--kv-timeout", "3",
                                   "--max-body-bytes", str(BODY_LIMIT), "--api-key-env", KEY_ENV], logs),
        }
    finally:
        del os.environ[KEY_ENV]
    start_all(list(ws.values()))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not asyncio.run(_listing())["encoder_urls"]:
        time.sleep(0.3)  # the encoder joins through --register-urls, with the key
    yield ws
    for w in ws.values():
        w.stop()


async def _listing() -> dict:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{P}/list_encoder_urls", headers=AUTH) as r:
        return await r.json()


def both(body, raw: bool = False):
    async def go():
        async with aiohttp.ClientSession() as s:
            return await asyncio.gather(post(s, f"http://127.0.0.1:{P}/v1/chat/completions", body, raw),
                                        post(s, f"http://127.0.0.1:{D}/v1/chat/completions", body, raw))
    return [(status, json.loads(text)) for status, text in asyncio.run(go())]


def roomed(images, **extra):
    return with_room(chat_body(MODEL, images, **extra), PB)


def check(result, status: int, code: str, contains: str = "") -> None:
    got, body = result
    assert got == status, body
    assert body["error"]["code"] == code and contains in body["error"]["message"], body


@pytest.mark.parametrize("images,code,contains", [
    ([png(1, 300)], "invalid_image_shape", "image 1: 1x300 has an aspect ratio over 200"),
    ([png(6000, 6000)] * 16, "image_too_large", "image 1: 6000x6000"),
    ([make_image(1), png(4097, 4096)], "image_too_large", "image 2: 4097x4096"),
    ([png(4096, 4096)] * 3, "image_too_large", "images 1-3 hold 50331648 pixels"),
])
def test_image_limits_from_the_header(workers, images, code, contains):
    before = asyncio.run(_listing())
    p, d = both(roomed([data_url(i) for i in images]))
    check(p, 400, code, contains)
    check(d, 400, code, contains)
    after = asyncio.run(_listing())
    assert after["encoder_urls"] == before["encoder_urls"] and all(e["failures"] == 0 for e in after["encoders"])


def test_encoder_answers_400_for_an_image_its_processor_refuses(workers):
    async def go():
        async with aiohttp.ClientSession() as s:
            out = []
            for imgs in ([png(1, 300)], [png(6000, 6000)], [make_image(2)] * 17):
                body = {"key": "k", "reply_to": "tcp://127.0.0.1:9", "images": [base64.b64encode(i).decode()
                                                                                for i in imgs]}
                out.append(await post(s, f"http://127.0.0.1:{E}/encode", body))
            return out
    results = [(status, json.loads(text)["error"]["code"]) for status, text in asyncio.run(go())]
    assert results == [(400, "invalid_image_shape"), (400, "image_too_large"), (400, "too_many_images")]


def test_deep_json_is_400_not_500(workers):
    raw = b'{"model": "tiny-vlm", "messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    p, d = both(raw, raw=True)
    check(p, 400, "invalid_json", "nested")
    check(d, 400, "invalid_json", "nested")


def test_oversized_prompt_is_refused_before_tokenising(workers):
    p, d = both(roomed([], text="lorem ipsum " * 150_000))  # 1.8 MB, under the body limit
    check(p, 400, "context_length_exceeded", "at least")
    check(d, 400, "context_length_exceeded", "at least")


def test_body_over_the_limit_is_413(workers):
    p, d = both(roomed([], text="x" * (BODY_LIMIT + 10)))
    check(p, 413, "request_too_large", str(BODY_LIMIT))
    check(d, 413, "request_too_large", str(BODY_LIMIT))


def test_remote_images_only_from_allowed_hosts(workers):
    for url in ("http://127.0.0.1:%d/metrics" % P, "http://169.254.169.254/latest/meta-data", "https://example.com/a.png"):
        p, _ = both(roomed([url]))
        check(p, 400, "image_fetch_forbidden", "data: URL")


def test_registry_needs_the_key_and_http_urls(workers):
    async def go():
        async with aiohttp.ClientSession() as s:
            out = []
            for port in (P, PEB):
                for url, headers in (("http://127.0.0.1:1", {}), ("file:///etc/passwd", AUTH), ("x y", AUTH)):
                    async with s.post(f"http://127.0.0.1:{port}/register_encoder_url", json={"url": url},
                                      headers=headers) as r:
                        out.append(r.status)
            async with s.get(f"http://127.0.0.1:{P}/list_encoder_urls") as r:
                out.append(r.status)
            return out
    assert asyncio.run(go()) == [401, 400, 400, 401, 400, 400, 401]
    assert asyncio.run(_listing())["encoder_urls"] == [f"http://127.0.0.1:{E}"]


def test_metrics_and_the_kv_bootstrap_need_the_key(workers):
    """/metrics of every worker, /kv/route and /kv/room on the prefill's bootstrap port: 401 without
    the cluster's key, served with it (smg sends its --api-key; Prometheus a credentials_file)."""
    async def go():
        out = []
        async with aiohttp.ClientSession() as s:
            for port in (E, P, D):
                for headers in ({}, {"Authorization": "Bearer wrong"}, AUTH):
                    async with s.get(f"http://127.0.0.1:{port}/metrics", headers=headers) as r:
                        out.append((port, r.status, "# TYPE" in await r.text()))
            for headers in ({}, AUTH):
                async with s.post(f"http://127.0.0.1:{PB}/kv/route", json={"room": 1, "reply_to": "tcp://127.0.0.1:1"},
                                  headers=headers) as r:
                    out.append((PB, r.status, False))
                async with s.get(f"http://127.0.0.1:{PB}/kv/room/1", headers=headers) as r:
                    out.append((PB, r.status, False))
        return out
    got = asyncio.run(go())
    for port in (E, P, D):
        assert [(st, typed) for p, st, typed in got if p == port] == [(401, False), (401, False), (200, True)], got
    assert [st for p, st, _ in got if p == PB] == [401, 401, 200, 200], got


def test_good_request_still_served(workers):
    p, d = both(roomed([data_url(make_image(3))], max_tokens=2))
    assert p[0] == 200 and d[0] == 200, (p, d)


def test_native_generate_and_tokenize_refuse_huge_text_before_tokenising(workers):
    text = "lorem ipsum " * 150_000

    async def go():
        async with aiohttp.ClientSession() as s:
            gen = await post(s, f"http://127.0.0.1:{P}/generate",
                             {"text": text, "bootstrap_host": "127.0.0.1", "bootstrap_port": PB,
                              "bootstrap_room": 7, "sampling_params": {"max_new_tokens": 4}})
            tok = await post(s, f"http://127.0.0.1:{P}/tokenize", {"prompt": text})
            return gen, tok
    for status, body in asyncio.run(go()):
        check((status, json.loads(body)), 400, "context_length_exceeded", "at least")


def test_an_encoder_400_passes_through_the_prefill_without_eviction(workers):
    """200x200 passes the prefill's limits but not the encoder's: the client gets the encoder's 400
    (not a 5xx), the encoder is not counted as failed, and the next request is served."""
    for _ in range(4):  # more than the 3 failures that would evict it
        p, d = both(roomed([data_url(png(200, 200))]))
        check(p, 400, "encoder_rejected", "image 1: 200x200 = 40000 pixels")
        check(d, 400, "encoder_rejected", "image 1: 200x200")
    listing = asyncio.run(_listing())
    assert listing["encoder_urls"] == [f"http://127.0.0.1:{E}"] and listing["encoders"][0]["failures"] == 0
    p, d = both(roomed([data_url(make_image(5))], max_tokens=2))
    assert p[0] == 200 and d[0] == 200, (p, d)
