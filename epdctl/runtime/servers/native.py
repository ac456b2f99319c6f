"""``/generate`` and ``/tokenize`` on prefill and decode workers (SGLang's native contract).

A prefill answers its first token (and, as SGLang does, hands its KV to the decode of the same
bootstrap room unless the host is ``FAKE_BOOTSTRAP_HOST``); a decode claims that KV and
generates the rest. The P->D canary compares the two: the decode's tokens must equal what the
prefill alone predicts for the same prefix, which holds only if the KV really arrived intact.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from epdctl.runtime.native_api import (
    FAKE_BOOTSTRAP_HOST, generate_response, parse_generate, tokenize_response, top_logprobs,
)
from epdctl.runtime.openai_api import ApiError, check_context
from epdctl.runtime.servers.common import json_response, read_json, to_api_error


def _limits(server: Any) -> dict[str, Any]:
    cfg = server.bundle.config.text_config
    return {"vocab_size": int(cfg.vocab_size), "context_length": server.info.context_length}


def add_native_routes(app: web.Application, server: Any, generate: Any) -> None:
    async def tokenize(request: web.Request) -> web.Response:
        body = await read_json(request)
        if isinstance(body.get("prompt"), str):
            _check_text(server, body["prompt"], 0)
        return json_response(tokenize_response(body, server.bundle.tokenizer, server.info.context_length))

    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/generate", generate)


def _check_text(server: Any, text: str | None, max_tokens: int) -> None:
    """A prompt that cannot fit is refused before it is tokenised (servers with an Admission)."""
    admission = getattr(server, "admission", None)
    if admission is not None and text:
        admission.text(text, max_tokens)


def _detok(server: Any, ids: list[int]) -> str:
    return server.bundle.tokenizer.decode(ids, skip_special_tokens=True)


def _sampling(server: Any, req: Any) -> Any:
    from epdctl.runtime.sampling import SamplingParams

    return SamplingParams.for_answer(max_tokens=req.max_new_tokens, temperature=req.temperature,
                                     top_p=req.top_p, seed=req.seed, ignore_eos=req.ignore_eos,
                                     eos_token_ids=server.bundle.eos_token_ids)


async def prefill_generate(server: Any, request: web.Request) -> web.Response:
    """Prefill one text prompt; answer its first token; hand the KV to the room's decode."""
    from epdctl.runtime.prompt import Prompt

    t_arrival = time.perf_counter()
    body = await read_json(request)
    try:
        req = parse_generate(body, require_room=True, **_limits(server))
        _check_text(server, req.text, req.max_new_tokens)
    except ApiError as err:
        if body.get("bootstrap_host") != FAKE_BOOTSTRAP_HOST:
            server._fail_partner(body.get("bootstrap_room"), err)
        server.m_requests.inc(labels={"status": str(err.status)})
        raise
    room = str(req.bootstrap_room)
    server.running += 1
    try:
        ids = req.input_ids or await server.thread.run(
            lambda: server.bundle.tokenizer(req.text, add_special_tokens=False)["input_ids"])
        check_context(len(ids), req.max_new_tokens, server.info.context_length)
        prompt = Prompt(input_ids=list(ids), image_token_counts=[], text=req.text or "")
        t0 = time.perf_counter()
        result = await server.thread.run(server.engine.prefill, prompt, [], _sampling(server, req))
        prefill_ms = (time.perf_counter() - t0) * 1000.0
    except Exception as exc:
        failure = to_api_error(exc)
        if not req.prefill_only:
            server._fail_partner(room, failure)
        server.m_requests.inc(labels={"status": str(failure.status)})
        raise failure from None
    finally:
        server.running -= 1
    server.m_requests.inc(labels={"status": "200"})
    server.m_stage.observe(prefill_ms / 1000.0, {"stage": "prefill"})
    first = int(result.first_token)
    top = ([top_logprobs(result.first_logits, req.top_logprobs_num, lambda t: _detok(server, t))]
           if req.return_logprob and req.top_logprobs_num else None)
    timings = {"encode_ms": 0.0, "prefill_ms": prefill_ms, "embedding_bytes": 0.0,
               "prefill_done_ms": (time.perf_counter() - t_arrival) * 1000.0}
    if req.prefill_only:
        del result  # SGLang's fake sender: the KV goes nowhere
    else:
        server.m_ttft.observe(time.perf_counter() - t_arrival)
        server._spawn(server._handoff(room, result, timings))
    finish = "stop" if first in server.bundle.eos_token_ids else "length"
    return json_response(generate_response(f"room-{room}", _detok(server, [first]), [first], len(ids),
                                           finish, top=top, extra={"timings": timings}))


async def decode_generate(server: Any, request: web.Request) -> web.Response:
    """Claim the room's KV and generate up to max_new_tokens; one JSON answer."""
    t_arrival = time.perf_counter()
    try:
        req = parse_generate(await read_json(request), require_room=True, **_limits(server))
        if req.prefill_only:
            raise ApiError(400, f"bootstrap_host {FAKE_BOOTSTRAP_HOST} asks for a prefill-only run; "
                                "send it to a prefill worker", "invalid_value")
        if not req.bootstrap_host or req.bootstrap_port is None:
            raise ApiError(400, "missing 'bootstrap_host'/'bootstrap_port': the decode must know the "
                                "prefill's bootstrap server (the PD router adds them)", "missing_field")
        meta, tensors, kv_wait_ms = await server._receive_kv(req)
        out = await _decode(server, req, meta, tensors, kv_wait_ms, t_arrival)
    except ApiError as err:
        server.gm.requests.inc(labels={"status": str(err.status)})
        raise
    server.gm.requests.inc(labels={"status": "200"})
    return json_response(out)


async def _decode(server: Any, req: Any, meta: dict, tensors: dict, kv_wait_ms: float,
                  t_arrival: float) -> dict[str, Any]:
    prompt_len = int(meta.get("prompt_len", 0))
    ids: list[int] = []
    t_first = None
    async with server.sequence(req.bootstrap_room, meta, tensors, _sampling(server, req)) as (
            seq_id, q, kv_bytes):
        server.used_tokens[seq_id] = prompt_len
        finished = False
        try:
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    raise ApiError(500, f"decode failed: {type(item).__name__}: {item}",
                                   "decode_failed", "server_error")
                t_first = t_first or time.perf_counter()
                ids.append(int(item[0]))
                server.used_tokens[seq_id] += 1
                if item[1]:
                    finished = True
                    break
        except asyncio.CancelledError:
            server.gm.disconnects.inc()
            raise
        finally:
            if not finished:
                server.loop.abort(seq_id)
    server.gm.tokens.inc(len(ids))
    if t_first is not None:
        server.gm.ttft.observe(t_first - t_arrival)
    stop = bool(ids) and not req.ignore_eos and ids[-1] in server.bundle.eos_token_ids
    text_ids = ids[:-1] if stop else ids
    pt = meta.get("timings", {})
    timings = {"prefill_ms": pt.get("prefill_ms", 0.0), "kv_wait_ms": kv_wait_ms, "kv_bytes": kv_bytes,
               "total_ms": (time.perf_counter() - t_arrival) * 1000.0}
    return generate_response(f"room-{req.bootstrap_room}", _detok(server, text_ids), ids, prompt_len,
                             "stop" if stop else "length", extra={"timings": timings})
