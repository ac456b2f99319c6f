"""Bad input against real encoder/prefill/decode processes: every case gets the right status and an
OpenAI-style error body ``{"error": {"message", "type", "code"}}``, no worker crashes, and 1,000 bad
requests leave RSS flat (lost partners, disconnects and SIGTERM: test_bad_input_lifecycle.py).
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys

import aiohttp
import pytest

from bad_input_workers import (D, E, IMG, MAX_IMAGE_BYTES, MODEL, P, PB, PNG,  # noqa: F401
                               assert_error, both, data_url, image_server, model_dir, roomed, run,
                               workers)
from worker_procs import ROOT, chat_body, post, with_room


def test_malformed_json(workers):
    for raw in (b'{"model": "tiny-vlm", "messages": [', b"[1, 2]", b"\xff\xfe"):
        p, d = both(raw, raw=True)
        assert_error(p, 400, "invalid_json")
        assert_error(d, 400, "invalid_json")


def test_unknown_model_is_404(workers):
    p, d = both(with_room({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}, PB))
    for r in (p, d):
        assert_error(r, 404, "model_not_found", "gpt-9")
        assert r[1]["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("body,contains", [
    ({"model": MODEL}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, "role"),
    ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "video"}]}]}, "unsupported part"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}, "max_tokens"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": 9}, "temperature"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stop": [1]}, "stop"),
])
def test_missing_or_invalid_fields(workers, body, contains):
    p, d = both(with_room(body, PB))
    assert_error(p, 400, None, contains)
    assert_error(d, 400, None, contains)


def test_missing_bootstrap_room(workers):
    p, d = both(chat_body(MODEL, [data_url(PNG)]))
    assert_error(p, 400, "missing_field", "bootstrap_room")
    assert_error(d, 400, "missing_field", "bootstrap_room")


def test_too_many_images_reaches_the_decode_too(workers):
    p, d = both(roomed([data_url(PNG)] * 3))
    assert_error(p, 400, "too_many_images", "3")
    assert_error(d, 400, "too_many_images", "too many images")


@pytest.mark.parametrize("images,code,contains", [
    ([data_url(b"definitely not an image")], "invalid_image", "image 1: cannot decode"),
    ([data_url(PNG), data_url(PNG[: len(PNG) // 2])], "invalid_image", "image 2: cannot decode"),
    (["data:image/png;base64,@@@not-base64@@@"], "invalid_image", "image 1: data URL payload is not valid base64"),
    (["data:image/png," + "x" * 10], "invalid_image", "image 1: data URL must look like"),
    ([data_url(b"\0" * (MAX_IMAGE_BYTES + 1))], "image_too_large", "image 1: image is larger than the limit"),
    (["/etc/hostname"], "local_files_disabled", "--allow-local-files"),
    (["ftp://example.com/a.png"], "invalid_image", "image 1: unsupported image reference"),
])
def test_bad_images(workers, images, code, contains):
    p, d = both(roomed(images))
    assert_error(p, 400, code, contains)
    assert_error(d, 400, code, contains)


@pytest.mark.parametrize("max_tokens", [5000, 4090])
def test_context_length_exceeded(workers, max_tokens):
    """5000 alone exceeds the 4096-token context; 4090 only together with the prompt (known after encoding)."""
    p, d = both(roomed([data_url(PNG)], max_tokens=max_tokens))
    assert_error(p, 400, "context_length_exceeded", "maximum context length is 4096")
    assert_error(d, 400, "context_length_exceeded", "maximum context length is 4096")


def test_http_images(workers, image_server):
    p, d = both(roomed([image_server + "/ok.png"], max_tokens=2))
    assert p[0] == 200 and d[0] == 200, (p, d)
    assert d[1]["object"] == "chat.completion"
    assert_error(both(roomed([image_server + "/missing.png"]))[0], 400, "image_fetch_failed", "HTTP 404")
    assert_error(both(roomed([image_server + "/slow.png"]))[0], 400, "image_fetch_failed", "longer than 1 s")
    assert_error(both(roomed([image_server + "/huge.png"]))[0], 400, "image_too_large", "image 1")
    assert_error(both(roomed([f"http://127.0.0.1:{IMG + 1}/nothing.png"]))[0], 400, "image_fetch_failed", "image 1")


def test_unknown_path_and_method(workers):
    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{P}/v2/nothing") as r1:
                a = (r1.status, await r1.json())
            async with s.get(f"http://127.0.0.1:{D}/v1/chat/completions") as r2:
                b = (r2.status, await r2.json())
        return a, b
    a, b = run(go())
    assert_error(a, 404, "not_found")
    assert_error(b, 405, "method_not_allowed")


BAD_BODIES = [
    lambda: b'{"model": ',
    lambda: with_room({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}, PB),
    lambda: roomed([data_url(b"not an image at all")]),
    lambda: roomed([data_url(PNG)] * 3),
]


async def _bad_requests(n: int, concurrency: int = 20) -> list[int]:
    statuses: list[int] = []
    async with aiohttp.ClientSession() as s:
        for start in range(0, n, concurrency):
            batch = []
            for i in range(start, min(n, start + concurrency)):
                body = BAD_BODIES[i % len(BAD_BODIES)]()
                raw = isinstance(body, bytes)
                batch.append(pd_pair(s, body, raw))
            for p, d in await asyncio.gather(*batch):
                statuses += [p, d]
    return statuses


async def pd_pair(s: aiohttp.ClientSession, body, raw: bool) -> tuple[int, int]:
    p, d = await asyncio.gather(post(s, f"http://127.0.0.1:{P}/v1/chat/completions", body, raw),
                                post(s, f"http://127.0.0.1:{D}/v1/chat/completions", body, raw))
    return p[0], d[0]


def test_memory_flat_across_1000_bad_requests(workers):
    statuses = run(_bad_requests(200))  # warm up allocator pools and caches first
    assert set(statuses) <= {400, 404}
    rss_before = {k: workers[k].rss() for k in ("p", "d")}
    statuses = run(_bad_requests(1000))
    assert set(statuses) <= {400, 404} and len(statuses) == 2000
    grown = {k: (workers[k].rss() - rss_before[k]) / 2**20 for k in ("p", "d")}
    print(f"RSS growth over 1,000 bad requests (MiB): {grown}")
    assert all(g < 64 for g in grown.values()), f"RSS grew by {grown} MiB over 1,000 bad requests"
    for w in workers.values():
        assert w.proc.poll() is None
    async def healthy():
        async with aiohttp.ClientSession() as s:
            return [(await s.get(f"http://127.0.0.1:{port}/health")).status for port in (E, P, D)]
    assert run(healthy()) == [200, 200, 200]


def test_bad_model_path_and_port_in_use(model_dir):
    cmd = [sys.executable, "-m", "epdctl.runtime"]
    bad = subprocess.run([*cmd, "decode", "--model-path", "/no/such/model", "--port", "33790"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines()[-1] == (
        "epdctl.runtime decode: error: --model-path /no/such/model: not a directory "
        "(pass a local Qwen2-VL checkpoint folder)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 33791))
        s.listen()
        busy = subprocess.run([*cmd, "decode", "--model-path", str(model_dir), "--port", "33791"],
                              capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert busy.returncode == 1
    last = busy.stderr.strip().splitlines()[-1]
    assert last.startswith("epdctl.runtime decode: error: cannot listen on 127.0.0.1:33791") and "in use" in last
