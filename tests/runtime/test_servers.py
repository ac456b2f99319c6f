"""Encoder + prefill + decode (and a colocated worker) as real processes, driven the way smg drives
them: the same body with bootstrap_host/port/room posted to prefill and decode at once, decode's
answer returned to the client. The answer must carry exactly the tokens of one-process greedy
``generate()``. Workers start once for the module (servers_cluster.py); tests run in file order
(encoder churn last).
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from aiohttp import web

from servers_cluster import (C, D, E0, E1, FAKE_E, MAX_TOKENS, MODEL, P, PB, PEB, T0,  # noqa: F401
                             _listed, _not, _post_one, cluster, data_url, expected, get_json, get_text,
                             listing, model_dir, pd, ref_bundle, run, stream_tokens, wait_for)
from tiny_model import make_image
from worker_procs import Worker, chat_body, metric, pd_call, post, sse_events, with_room


def test_registration_endpoints(cluster):
    for port, mode in ((P, "prefill"), (D, "decode"), (C, "null")):
        base = f"http://127.0.0.1:{port}"
        status, info = run(get_json(base + "/server_info"))
        assert status == 200
        assert info["served_model_name"] == MODEL and info["disaggregation_mode"] == mode
        assert {"model_path", "disaggregation_bootstrap_port", "max_running_requests", "max_images_per_request",
                "transport", "version"} <= set(info)
        assert run(get_json(base + "/model_info"))[1]["served_model_name"] == MODEL
        assert run(get_json(base + "/v1/models"))[1]["data"][0]["id"] == MODEL
        loads = run(get_json(base + "/v1/loads?include=core,disagg,queues,memory"))[1]
        assert loads["dp_rank_count"] == 1 and loads["loads"][0]["dp_rank"] == 0
        assert {"num_running_reqs", "num_waiting_reqs", "num_used_tokens", "max_total_num_tokens", "token_usage",
                "max_running_requests"} <= set(loads["loads"][0])
        assert run(get_json(base + "/health"))[0] == 200
        gen = run(get_json(base + "/health_generate"))
        assert gen[0] == 200 and gen[1]["status"] == "ok", gen
    assert run(get_json(f"http://127.0.0.1:{P}/server_info"))[1]["disaggregation_bootstrap_port"] == PB
    prefill_metrics = run(get_text(f"http://127.0.0.1:{P}/metrics"))
    decode_metrics = run(get_text(f"http://127.0.0.1:{D}/metrics"))
    for series in ("epd_prefill_ttft_seconds histogram", "epd_prefill_stage_seconds histogram",
                   "epd_prefill_queue_depth gauge", "epd_prefill_embedding_cache_total counter",
                   "epd_prefill_transport_bytes_received_total counter"):
        assert f"# TYPE {series}" in prefill_metrics
    for series in ("epd_decode_ttft_seconds histogram", "epd_decode_tpot_seconds histogram",
                   "epd_decode_queue_depth gauge", "epd_decode_stage_seconds histogram",
                   "epd_decode_transport_bytes_received_total counter"):
        assert f"# TYPE {series}" in decode_metrics
    assert run(get_json(f"http://127.0.0.1:{E0}/health"))[0] == 200
    assert "# TYPE epd_encoder_cache_hits_total counter" in run(get_text(f"http://127.0.0.1:{E0}/metrics"))


@pytest.mark.parametrize("stream", [False, True])
def test_pd_matches_generate(cluster, ref_bundle, stream):
    pngs = [make_image(1), make_image(2)]
    want = expected(ref_bundle, pngs)
    body = chat_body(MODEL, [data_url(p) for p in pngs], max_tokens=MAX_TOKENS, stream=stream, return_token_ids=True)
    out = pd(body)
    if stream:
        ids, text, last = stream_tokens(out)
        usage, timings, finish = last["usage"], last["timings"], last["choices"][0]["finish_reason"]
        assert out[0]["choices"][0]["delta"]["role"] == "assistant"
    else:
        ids, text = out["choices"][0]["token_ids"], out["choices"][0]["message"]["content"]
        usage, timings, finish = out["usage"], out["timings"], out["choices"][0]["finish_reason"]
        assert out["object"] == "chat.completion"
    assert ids == want
    assert text == ref_bundle.tokenizer.decode(want, skip_special_tokens=True)
    assert finish == ("stop" if want[-1] in ref_bundle.eos_token_ids else "length")
    assert usage["completion_tokens"] == len(want) and usage["prompt_tokens"] > 0
    assert {"encode_ms", "prefill_ms", "kv_transfer_ms", "decode_ms", "ttft_ms", "total_ms", "kv_bytes",
            "embedding_bytes"} <= set(timings)
    assert timings["kv_bytes"] > 0 and timings["embedding_bytes"] > 0


def test_each_role_exports_its_own_busy_time_and_queue(cluster):
    """After the requests above every role has spent time on its own work (the rebalance
    policy's utilisation signal), less than it has been up, and nothing queues for it now."""
    for port, role in ((E0, "encoder"), (P, "prefill"), (D, "decode")):
        text = run(get_text(f"http://127.0.0.1:{port}/metrics"))
        assert f"# TYPE epd_{role}_busy_seconds_total counter" in text
        busy = metric(text, f"epd_{role}_busy_seconds_total")
        assert 0.0 < busy < time.time() - T0, (role, busy)
        assert metric(text, f"epd_{role}_own_queue_depth") == 0.0


def test_each_worker_froze_its_startup_heap_and_times_its_gc_pauses(cluster):
    """Every role froze what it loaded (a full collection would otherwise walk ~380k objects,
    ~200 ms, inside some request) and exports its collector's pauses."""
    for port, role in ((E0, "encoder"), (P, "prefill"), (D, "decode")):
        text = run(get_text(f"http://127.0.0.1:{port}/metrics"))
        assert metric(text, f"epd_{role}_gc_frozen_objects") > 50_000, role
        pauses = metric(text, f"epd_{role}_gc_pauses_total")
        total = metric(text, f"epd_{role}_gc_pause_seconds_total")
        longest = metric(text, f"epd_{role}_gc_pause_longest_seconds")
        assert pauses >= 0 and 0.0 <= longest <= total, (role, pauses, total, longest)
        assert (pauses == 0) == (total == 0.0), (role, pauses, total)


def test_concurrent_requests_batch_and_match(cluster, ref_bundle):
    cases = [[make_image(3)], [make_image(4), make_image(5)], [make_image(6), make_image(7), make_image(3)]]
    wants = [expected(ref_bundle, pngs) for pngs in cases]

    async def all_at_once():
        bodies = [with_room(chat_body(MODEL, [data_url(p) for p in pngs], max_tokens=MAX_TOKENS,
                                      return_token_ids=True), PB) for pngs in cases]
        return await asyncio.gather(*(pd_call(f"http://127.0.0.1:{P}", f"http://127.0.0.1:{D}", b) for b in bodies))

    for (pres, dres), want in zip(run(all_at_once()), wants):
        assert pres[0] == 200 and dres[0] == 200, (pres, dres)
        assert json.loads(dres[1])["choices"][0]["token_ids"] == want


def test_stop_string(cluster, ref_bundle):
    pngs = [make_image(8)]
    want = expected(ref_bundle, pngs, max_tokens=MAX_TOKENS)
    full = ref_bundle.tokenizer.decode(want, skip_special_tokens=True)
    assert len(full) >= 4, f"reference text too short to cut: {full!r}"
    stop = full[len(full) // 2:len(full) // 2 + 2]
    cut = full[:full.find(stop)]
    for stream in (False, True):
        out = pd(chat_body(MODEL, [data_url(pngs[0])], max_tokens=MAX_TOKENS, stop=[stop], stream=stream))
        if stream:
            _, text, last = stream_tokens(out)
            finish = last["choices"][0]["finish_reason"]
        else:
            text, finish = out["choices"][0]["message"]["content"], out["choices"][0]["finish_reason"]
        assert (text, finish) == (cut, "stop")


def test_repeated_image_hits_encoder_cache(cluster):
    url = data_url(make_image(9))
    before = metric(run(get_text(f"http://127.0.0.1:{P}/metrics")), 'epd_prefill_embedding_cache_total{result="hit"}')
    pd(chat_body(MODEL, [url], max_tokens=2))
    pd(chat_body(MODEL, [url], max_tokens=2))
    after = metric(run(get_text(f"http://127.0.0.1:{P}/metrics")), 'epd_prefill_embedding_cache_total{result="hit"}')
    assert after >= before + 1


@pytest.mark.parametrize("stream", [False, True])
def test_colocated_matches_generate(cluster, ref_bundle, stream):
    pngs = [make_image(2), make_image(5)]
    want = expected(ref_bundle, pngs)
    body = chat_body(MODEL, [data_url(p) for p in pngs], max_tokens=MAX_TOKENS, stream=stream, return_token_ids=True)
    status, text = run(_post_one(f"http://127.0.0.1:{C}/v1/chat/completions", body))
    assert status == 200, text
    ids = stream_tokens(sse_events(text))[0] if stream else json.loads(text)["choices"][0]["token_ids"]
    assert ids == want


def test_seeded_sampling_is_the_same_split_or_colocated(cluster):
    """temperature/top_p/seed: the split pipeline draws exactly what the colocated worker draws."""
    body = chat_body(MODEL, [data_url(make_image(6))], max_tokens=MAX_TOKENS, temperature=1.0, top_p=0.9,
                     seed=1234, return_token_ids=True)
    split = [pd(body)["choices"][0]["token_ids"] for _ in range(2)]
    status, text = run(_post_one(f"http://127.0.0.1:{C}/v1/chat/completions", body))
    assert status == 200, text
    assert split[0] == split[1] == json.loads(text)["choices"][0]["token_ids"]


def test_registry_api_on_both_ports(cluster):
    """Register/unregister on the HTTP port and the encoder-bootstrap port; an encoder that does not
    answer /health is refused (400), so a bogus registration never receives requests."""
    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def scenario():
        app = web.Application()
        app.router.add_get("/health", ok)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", FAKE_E + 1).start()
        return runner

    async def stop(runner):
        await runner.cleanup()

    fake = f"http://127.0.0.1:{FAKE_E + 1}"
    loop = asyncio.new_event_loop()
    runner = loop.run_until_complete(scenario())
    try:
        for port in (P, PEB):
            status, body = run(_post_one(f"http://127.0.0.1:{port}/register_encoder_url", {"url": "http://127.0.0.1:9"}))
            assert status == 400 and "does not answer" in body
            status, _ = loop.run_until_complete(_post_one(f"http://127.0.0.1:{port}/register_encoder_url",
                                                          {"url": fake}))
            assert status == 200
            assert fake in [e["url"] for e in listing(P)["encoders"]]
            assert fake in [e["url"] for e in listing(PEB)["encoders"]]

            async def unregister():
                async with aiohttp.ClientSession() as s, s.delete(f"http://127.0.0.1:{port}/unregister_encoder_url",
                                                                   json={"url": fake}) as r:
                    return r.status
            assert loop.run_until_complete(unregister()) == 200
            assert fake not in [e["url"] for e in listing(P)["encoders"]]
    finally:
        loop.run_until_complete(stop(runner))
        loop.close()


def test_eviction_and_readmission(cluster):
    """A registered encoder that fails 3 probes is evicted, and re-admitted once it answers again."""
    healthy = {"ok": True}

    async def scenario():
        async def health(_):
            return web.Response(status=200 if healthy["ok"] else 503)

        app = web.Application()
        app.router.add_get("/health", health)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", FAKE_E).start()
        url = f"http://127.0.0.1:{FAKE_E}"
        try:
            async with aiohttp.ClientSession() as s:
                await post(s, f"http://127.0.0.1:{PEB}/register_encoder_url", {"url": url})

                async def state():
                    _, body = await get_json(f"http://127.0.0.1:{PEB}/list_encoder_urls")
                    return {e["url"]: e for e in body["encoders"]}[url], body["encoder_urls"]

                healthy["ok"] = False
                await wait_for(lambda: _not(state, url), "eviction")
                entry, _ = await state()
                assert entry["failures"] >= 3 and entry["healthy"] is False
                healthy["ok"] = True
                await wait_for(lambda: _listed(state, url), "re-admission")
                async with s.delete(f"http://127.0.0.1:{PEB}/unregister_encoder_url", json={"url": url}) as r:
                    assert r.status == 200
        finally:
            await runner.cleanup()

    run(scenario())


def test_encoder_joins_at_runtime_and_survives_a_killed_one(cluster, ref_bundle, model_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("e1")
    e1 = Worker("encoder", ["--model-path", str(model_dir), "--port", str(E1),
                            "--register-urls", f"http://127.0.0.1:{PEB}"], logs, "encoder1")
    cluster["e1"] = e1
    e1.wait_ready()
    e1_url = f"http://127.0.0.1:{E1}"

    async def registered():
        return e1_url in (await get_json(f"http://127.0.0.1:{P}/list_encoder_urls"))[1]["encoder_urls"]
    run(wait_for(registered, "encoder1 self-registration"))

    cluster["e0"].kill()
    e0_url = f"http://127.0.0.1:{E0}"

    async def evicted():
        return e0_url not in (await get_json(f"http://127.0.0.1:{P}/list_encoder_urls"))[1]["encoder_urls"]
    run(wait_for(evicted, "eviction of the killed encoder0"))

    pngs = [make_image(11), make_image(12), make_image(13)]
    want = expected(ref_bundle, pngs)
    out = pd(chat_body(MODEL, [data_url(p) for p in pngs], max_tokens=MAX_TOKENS, return_token_ids=True))
    assert out["choices"][0]["token_ids"] == want
    served = {e["url"]: e["served"] for e in listing(P)["encoders"]}
    assert served[e1_url] >= 3

    assert e1.stop() == 0  # SIGTERM: graceful, unregisters itself
    assert e1_url not in [e["url"] for e in listing(P)["encoders"]]
    (ps, pbody), (ds, dbody) = run(pd_call(f"http://127.0.0.1:{P}", f"http://127.0.0.1:{D}",
                                           with_room(chat_body(MODEL, [data_url(pngs[0])]), PB)))
    assert ps == 503 and json.loads(pbody)["error"]["code"] == "no_encoder"
    assert ds == 503 and "no healthy encoder" in json.loads(dbody)["error"]["message"]
