"""The servers tests' cluster: encoder + prefill + decode + colocated as real processes (started
once per test module that imports ``cluster``), the one-process greedy reference, and the
helpers that drive the workers the way smg does."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path

import aiohttp
import pytest

from conftest import image_messages, reference_generate
from worker_procs import Worker, pd_call, pick_model, post, sse_events, start_all, with_room

E0, E1, P, PB, PEB, D, C, FAKE_E = 33600, 33601, 33610, 33611, 33612, 33620, 33630, 33640
MODEL = "tiny-vlm"
MAX_TOKENS = 10
T0 = time.time()  # before any worker starts: no worker can have been busy longer



@pytest.fixture(scope="module")
def model_dir(tiny_ckpt, tmp_path_factory) -> Path:
    return pick_model(tmp_path_factory.mktemp("model"), tiny_ckpt)


@pytest.fixture(scope="module")
def ref_bundle(model_dir):
    from epdctl.runtime.model import load_bundle

    return load_bundle(str(model_dir), role="colocated")


@pytest.fixture(scope="module")
def cluster(model_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    m = ["--model-path", str(model_dir), "--fast"]  # the fast path (its GC freezing and shm hand-offs are tested here)
    workers = {
        "e0": Worker("encoder", [*m, "--port", str(E0)], logs, "encoder0"),
        "p": Worker("prefill", [*m, "--served-model-name", MODEL, "--port", str(P), "--bootstrap-port", str(PB),
                                "--encoder-bootstrap-port", str(PEB), "--encoder-urls", f"http://127.0.0.1:{E0}",
                                "--encoder-probe-interval", "0.5", "--kv-timeout", "60"], logs),
        "d": Worker("decode", [*m, "--served-model-name", MODEL, "--port", str(D), "--kv-timeout", "60"], logs),
        "c": Worker("colocated", [*m, "--served-model-name", MODEL, "--port", str(C)], logs),
    }
    start_all(list(workers.values()))
    yield workers
    for w in workers.values():
        w.stop()


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def run(coro):
    return asyncio.run(coro)


async def get_json(url: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, await r.json(content_type=None)


async def get_text(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        assert r.status == 200
        return await r.text()


def expected(ref_bundle, pngs: list[bytes], text: str = "describe the image", max_tokens: int = MAX_TOKENS):
    _, tokens, _ = reference_generate(ref_bundle, pngs, image_messages(len(pngs), text), max_tokens)
    return tokens


def pd(body: dict) -> dict | list:
    """One request through prefill+decode; returns decode's JSON body or SSE events."""
    (ps, pbody), (ds, dbody) = run(pd_call(f"http://127.0.0.1:{P}", f"http://127.0.0.1:{D}", with_room(body, PB)))
    assert ps == 200, pbody
    assert ds == 200, dbody
    return sse_events(dbody) if body.get("stream") else json.loads(dbody)


def stream_tokens(events: list) -> tuple[list[int], str, dict]:
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    ids = [t for c in chunks for t in c["choices"][0].get("token_ids", [])]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    return ids, text, chunks[-1]


async def _post_one(url: str, body: dict) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s:
        return await post(s, url, body)


async def wait_for(predicate, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.3)
    raise AssertionError(f"gave up waiting for {what}")


def listing(port: int) -> dict:
    return run(get_json(f"http://127.0.0.1:{port}/list_encoder_urls"))[1]


async def _not(state, url):
    return url not in (await state())[1]


async def _listed(state, url):
    return url in (await state())[1]
