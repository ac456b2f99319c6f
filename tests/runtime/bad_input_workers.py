"""The real encoder/prefill/decode processes the bad-input tests send to (random checkpoint,
tight limits), an image server, and the helpers that send like smg and check OpenAI-style error
bodies. Fixtures are module-scoped: each test module that imports them gets its own workers."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
import urllib.request

import aiohttp
import pytest
from aiohttp import web

from tiny_model import make_image
from worker_procs import Worker, chat_body, metric, post, start_all, with_room


E, P, PB, PEB, D, IMG = 33700, 33710, 33711, 33712, 33720, 33730
MODEL = "tiny-vlm"
MAX_IMAGE_BYTES = 20000
KV_TIMEOUT = 3
PNG = make_image(1)

@pytest.fixture(scope="module")
def model_dir(tiny_ckpt):
    """The random checkpoint, not the trained one: the disconnect test needs an answer that does not
    end early, and a trained model answers briefly."""
    return tiny_ckpt


@pytest.fixture(scope="module")
def workers(model_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    m = ["--model-path", str(model_dir)]
    ws = {
        "e": Worker("encoder", [*m, "--port", str(E), "--register-urls", f"http://127.0.0.1:{PEB}"], logs),
        "p": Worker("prefill", [*m, "--served-model-name", MODEL, "--port", str(P), "--bootstrap-port", str(PB),
                                "--encoder-bootstrap-port", str(PEB), "--kv-timeout", str(KV_TIMEOUT),
                                "--max-images-per-request", "2", "--max-image-bytes", str(MAX_IMAGE_BYTES),
                                "--image-fetch-timeout", "1", "--image-fetch-hosts", "127.0.0.1"], logs),
        "d": Worker("decode", [*m, "--served-model-name", MODEL, "--port", str(D), "--kv-timeout", str(KV_TIMEOUT)],
                    logs),
    }
    start_all(list(ws.values()))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the encoder joins through --register-urls
        with urllib.request.urlopen(f"http://127.0.0.1:{P}/list_encoder_urls", timeout=5) as resp:
            if json.loads(resp.read())["encoder_urls"]:
                break
        time.sleep(0.3)
    yield ws
    for w in ws.values():
        w.stop()
    for w in ws.values():  # no crash: every worker exited through the graceful path
        assert w.proc.returncode == 0, f"{w.name} exited {w.proc.returncode}:\n{w.log_tail()}"


@pytest.fixture(scope="module")
def image_server():
    """http(s) image URLs: a good one, a 404, a slow one and an oversized chunked one."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    async def ok(_):
        return web.Response(body=PNG, content_type="image/png")

    async def slow(_):
        await asyncio.sleep(5)
        return web.Response(body=PNG, content_type="image/png")

    async def huge(request):
        resp = web.StreamResponse()
        await resp.prepare(request)
        for _ in range(10):
            await resp.write(b"\0" * 10000)
        return resp

    async def start():
        app = web.Application()
        app.router.add_get("/ok.png", ok)
        app.router.add_get("/slow.png", slow)
        app.router.add_get("/huge.png", huge)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", IMG).start()
        return runner

    state = {}

    def main():
        asyncio.set_event_loop(loop)
        state["runner"] = loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    ready.wait(10)
    yield f"http://127.0.0.1:{IMG}"
    asyncio.run_coroutine_threadsafe(state["runner"].cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def run(coro):
    return asyncio.run(coro)


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def both(body, raw: bool = False):
    """Send like smg (same body to P and D at once); return ((status, json), (status, json))."""
    async def go():
        async with aiohttp.ClientSession() as s:
            return await asyncio.gather(post(s, f"http://127.0.0.1:{P}/v1/chat/completions", body, raw),
                                        post(s, f"http://127.0.0.1:{D}/v1/chat/completions", body, raw))
    return [(status, json.loads(text)) for status, text in run(go())]


def assert_error(result, status: int, code: str | None = None, contains: str = ""):
    got_status, body = result
    assert got_status == status, body
    err = body["error"]
    assert {"message", "type", "code"} <= set(err)
    if code is not None:
        assert err["code"] == code, err
    assert contains in err["message"], err


def roomed(images, **extra):
    return with_room(chat_body(MODEL, images, **extra), PB)


async def _metrics(port: int) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
        return await r.text()


async def _wait_metric(port: int, name: str, predicate, timeout: float = 120.0,
                       interval: float = 0.3) -> float:
    deadline = time.monotonic() + timeout
    while True:
        value = metric(await _metrics(port), name)
        if predicate(value) or time.monotonic() > deadline:
            return value
        await asyncio.sleep(interval)
