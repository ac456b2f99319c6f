"""Lost partners and leaving clients against real encoder/prefill/decode processes: the decode
partner of a failed prefill gets the same error instead of waiting, lost partners time out with
their KV freed, a client leaving mid-stream aborts its sequence, a late KV is dropped, and a
request in flight when SIGTERM arrives completes. Own workers (bad_input_workers.py).
"""

from __future__ import annotations

import asyncio
import json
import signal

import aiohttp

from bad_input_workers import (D, KV_TIMEOUT, P, PNG, _metrics, _wait_metric,  # noqa: F401
                               assert_error, data_url, model_dir, roomed, run, workers)
from conftest import image_messages, reference_generate
from tiny_model import make_image
from worker_procs import metric, post


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
