"""Bad input against real encoder/prefill/decode processes: every case gets the right status and an
OpenAI-style error body ``{"error": {"message", "type", "code"}}``, the decode partner of a failed
prefill gets the same error instead of waiting, lost partners time out with their KV freed, a client
leaving mid-stream aborts its sequence, no worker crashes, and 1,000 bad requests leave RSS flat.
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import aiohttp
import pytest
from aiohttp import web

from conftest import image_messages, reference_generate
from tiny_model import make_image
from worker_procs import ROOT, Worker, chat_body, metric, post, start_all, with_room

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


def test_prefill_without_decode_times_out_and_frees_kv(workers):
    name = 'epd_prefill_kv_handoffs_total{outcome="no_decode"}'
    before = metric(run(_metrics(P)), name)

    async def go():
        async with aiohttp.ClientSession() as s:
            status, _ = await post(s, f"http://127.0.0.1:{P}/v1/chat/completions", roomed([data_url(PNG)]))
        assert status == 200  # the prefill itself succeeded; only the hand-off is orphaned
        assert metric(await _metrics(P), "epd_prefill_pending_kv_handoffs") == 1
        after = await _wait_metric(P, name, lambda v: v > before)
        held = await _wait_metric(P, "epd_prefill_pending_kv_handoffs", lambda v: v == 0)
        return after, held
    after, held = run(go())
    assert after == before + 1
    assert held == 0
    assert "no decode asked for this KV" in workers["p"].log_path.read_text()


def test_decode_without_prefill_times_out(workers):
    async def go():
        async with aiohttp.ClientSession() as s:
            lost = await post(s, f"http://127.0.0.1:{D}/v1/chat/completions", roomed([data_url(PNG)]))
            body = {**roomed([data_url(PNG)]), "bootstrap_port": 33799}  # nothing listens there
            unreachable = await post(s, f"http://127.0.0.1:{D}/v1/chat/completions", body)
        return (lost[0], json.loads(lost[1])), (unreachable[0], json.loads(unreachable[1]))
    lost, unreachable = run(go())
    assert_error(lost, 504, "kv_timeout", f"within {KV_TIMEOUT} s")
    assert_error(unreachable, 502, "bootstrap_failed", "33799")
    assert metric(run(_metrics(D)), "epd_decode_running_requests") == 0


_LONG_ANSWER: dict[str, int] = {}


def _long_answer_image(model_dir, max_tokens: int = 120) -> int:
    """An image whose greedy answer runs max_tokens without EOS, so a request stays in flight."""
    key = f"{model_dir}:{max_tokens}"
    if key not in _LONG_ANSWER:
        from epdctl.runtime.model import load_bundle

        bundle = load_bundle(str(model_dir), role="colocated")
        for i in range(20, 26):
            _, tokens, _ = reference_generate(bundle, [make_image(i)], image_messages(1, "count the images"), max_tokens)
            if len(tokens) == max_tokens and not set(tokens) & set(bundle.eos_token_ids):
                _LONG_ANSWER[key] = i
                break
        del bundle
    assert key in _LONG_ANSWER, f"no test prompt generates {max_tokens} tokens without EOS on this model"
    return _LONG_ANSWER[key]


def test_client_disconnect_mid_stream_aborts(workers, model_dir):
    max_tokens = 120
    chosen = _long_answer_image(model_dir, max_tokens)

    async def go():
        body = roomed([data_url(make_image(chosen))], text="count the images", max_tokens=max_tokens, stream=True)
        gen_before = metric(await _metrics(D), "epd_decode_generated_tokens_total")
        async with aiohttp.ClientSession() as s:
            prefill = asyncio.create_task(post(s, f"http://127.0.0.1:{P}/v1/chat/completions", body))
            resp = await s.post(f"http://127.0.0.1:{D}/v1/chat/completions", json=body)
            assert resp.status == 200
            async for line in resp.content:
                if line.startswith(b"data: ") and b'"content":"' in line and b'"content":""' not in line:
                    break
            resp.close()  # the client goes away after the first token
            assert (await prefill)[0] == 200
        gone = await _wait_metric(D, "epd_decode_client_disconnects_total", lambda v: v >= 1)
        running = await _wait_metric(D, "epd_decode_running_requests", lambda v: v == 0)
        gen_after = metric(await _metrics(D), "epd_decode_generated_tokens_total")
        return gone, running, gen_after - gen_before
    gone, running, generated = run(go())
    assert gone == 1 and running == 0
    assert generated == 0  # the sequence never finished: it was aborted, not run to max_tokens


def test_client_gone_before_kv_arrives_drops_the_late_kv(workers):
    name = 'epd_decode_kv_receive_total{outcome="late"}'

    async def go():
        before = metric(await _metrics(D), name)
        body = roomed([data_url(PNG)], max_tokens=4, stream=True)
        async with aiohttp.ClientSession() as s:
            waiting = asyncio.create_task(s.post(f"http://127.0.0.1:{D}/v1/chat/completions", json=body))
            await _wait_metric(D, "epd_decode_queue_depth", lambda v: v == 1)  # registered, awaiting KV
            waiting.cancel()  # the client goes away
            await asyncio.gather(waiting, return_exceptions=True)
        async with aiohttp.ClientSession() as s:
            status, _ = await post(s, f"http://127.0.0.1:{P}/v1/chat/completions", body)
        assert status == 200
        late = await _wait_metric(D, name, lambda v: v > before)
        depth = await _wait_metric(D, "epd_decode_queue_depth", lambda v: v == 0)
        return late - before, depth
    assert run(go()) == (1, 0)


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


def test_sigterm_lets_in_flight_requests_finish(workers, model_dir):
    """Last test of the module: it stops the decode. A request in flight when SIGTERM arrives completes."""
    async def go():
        # An answer that cannot end early, and a fast poll: on an idle machine a short answer
        # finished before a slow poll ever saw it running.
        image = _long_answer_image(model_dir, 120)
        body = roomed([data_url(make_image(image))], text="count the images", max_tokens=120)
        async with aiohttp.ClientSession() as s:
            call = asyncio.gather(post(s, f"http://127.0.0.1:{P}/v1/chat/completions", body),
                                  post(s, f"http://127.0.0.1:{D}/v1/chat/completions", body))
            running = await _wait_metric(D, "epd_decode_running_requests", lambda v: v == 1,
                                         timeout=60.0, interval=0.01)
            workers["d"].proc.send_signal(signal.SIGTERM)
            (ps, _), (ds, dtext) = await call
        return running, ps, ds, json.loads(dtext)
    running, ps, ds, body = run(go())
    assert running == 1 and ps == 200 and ds == 200, body
    assert body["usage"]["completion_tokens"] == 120
    assert workers["d"].proc.wait(60) == 0
