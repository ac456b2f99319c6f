"""Colocated worker: encoder, prefill and decode in one process, no transport.

The same engines as the split deployment, so behind a regular-mode router it gives the
side-by-side baseline for EPD. Every model call runs on the one engine thread, between decode
steps, because the three engines share one model object.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

import aiohttp
from aiohttp import web

from epdctl.runtime.limits import limits_from_args
from epdctl.runtime.metrics import Registry
from epdctl.runtime.openai_api import ApiError, parse_chat_request
from epdctl.runtime import paths
from epdctl.runtime.servers.admission import Admission
from epdctl.runtime.servers.common import Stopwatch, make_app, read_json, ready, to_api_error
from epdctl.runtime.servers.decode import GenerationMetrics
from epdctl.runtime.servers.engine_loop import EngineLoop
from epdctl.runtime.servers.info import WorkerInfo, add_info_routes
from epdctl.runtime.servers.registry import api_key_from_env

log = logging.getLogger(__name__)


class ColocatedServer:
    def __init__(self, args: Any, bundle: Any, encoder: Any, prefill: Any, decode: Any, info: WorkerInfo):
        from epdctl.runtime.prompt import build_prompt
        from epdctl.runtime.sampling import SamplingParams

        self._build_prompt, self._Sampling = build_prompt, SamplingParams
        self.args = args
        self.bundle = bundle
        self.encoder = encoder
        self.prefill = prefill
        self.decode = decode
        self.info = info
        self.limits = limits_from_args(args)
        self.admission = Admission(self.limits, bundle, info.context_length)
        self.loop: EngineLoop | None = None
        self.session: aiohttp.ClientSession | None = None
        self.slots = asyncio.Semaphore(args.max_running_requests)
        self.waiting = 0
        self.used_tokens: dict[str, int] = {}
        self.metrics = Registry("epd_colocated")
        self.gm = GenerationMetrics(self.metrics)
        m = self.metrics
        paths.active().add_metrics(m)
        stats = lambda k: (lambda: float(self.encoder.stats.get(k, 0)))  # noqa: E731
        m.counter_fn("embedding_cache_hits_total", "Embedding-cache hits", stats("cache_hits"))
        m.counter_fn("embedding_cache_misses_total", "Embedding-cache misses", stats("cache_misses"))
        m.gauge("running_requests", "Sequences being decoded", lambda: float(self.loop.num_running if self.loop else 0))
        m.gauge("queue_depth", "Requests waiting for a slot or a model call",
                lambda: float(self.waiting + (self.loop.pending_commands if self.loop else 0)))

    def app(self) -> web.Application:
        app = make_app(self.limits.max_body_bytes)
        app.router.add_post("/v1/chat/completions", self.h_chat)
        add_info_routes(app, self.info, self.metrics, self.loads, self.health_generate)
        return app

    def loads(self) -> dict[str, int]:
        return {"num_running_reqs": self.loop.num_running if self.loop else 0, "num_waiting_reqs": self.waiting,
                "num_used_tokens": sum(self.used_tokens.values())}

    def _params(self, req: Any) -> Any:
        return self._Sampling.for_answer(max_tokens=req.max_tokens, temperature=req.temperature,
                                         top_p=req.top_p, seed=req.seed, ignore_eos=req.ignore_eos,
                                         eos_token_ids=self.bundle.eos_token_ids)

    async def health_generate(self) -> dict[str, Any]:
        """A real two-token generation through the whole in-process pipeline."""
        params = self._Sampling(max_tokens=2, stop_token_ids=[])
        prompt = await ready(self.loop, 'engine loop').call(self._build_prompt, self.bundle, [{"role": "user", "content": "hi"}], [])
        result = await ready(self.loop, 'engine loop').call(self.prefill.prefill, prompt, [], params)
        q = await ready(self.loop, 'engine loop').add("health-" + uuid.uuid4().hex, result, params)
        tokens = []
        while True:
            item = await asyncio.wait_for(q.get(), 30)
            if not isinstance(item, tuple):
                raise ApiError(503, f"health generation failed: {item}", "unhealthy")
            tokens.append(item[0])
            if item[1]:
                return {"tokens": tokens}

    async def h_chat(self, request: web.Request) -> web.StreamResponse:
        t_arrival = time.perf_counter()
        try:
            req = parse_chat_request(await read_json(request), self.info.served_name,
                                     max_images=self.args.max_images_per_request, require_room=False,
                                     context_length=self.info.context_length)
            self.admission.text_tokens_at_least(req)
            resp = await self._serve(request, req, t_arrival)
        except Exception as exc:
            err = to_api_error(exc)
            self.gm.requests.inc(labels={"status": str(err.status)})
            raise err from None
        self.gm.requests.inc(labels={"status": "200"})
        return resp

    async def _serve(self, request: web.Request, req: Any, t_arrival: float) -> web.StreamResponse:
        self.waiting += 1
        try:
            await self.slots.acquire()
        finally:
            self.waiting -= 1
        seq_id = uuid.uuid4().hex
        try:
            watch = Stopwatch()
            t_in = time.time() - (time.perf_counter() - t_arrival)
            images = await self.admission.images(req, ready(self.session, 'HTTP client'))
            t_enc = time.time()
            encoded = await ready(self.loop, 'engine loop').call(self.encoder.encode, images) if images else []
            encode_ms = watch.lap()
            t_emb = time.time()
            prompt = await ready(self.loop, 'engine loop').call(self._build_prompt, self.bundle, req.messages, [e.grid_thw for e in encoded])
            self.admission.prompt(len(prompt.input_ids), req.max_tokens)
            params = self._params(req)
            result = await ready(self.loop, 'engine loop').call(self.prefill.prefill, prompt, encoded, params)
            prefill_ms = watch.lap()
            t_pf = time.time()
            self.gm.stage.observe(encode_ms / 1000.0, {"stage": "encode"})
            self.gm.stage.observe(prefill_ms / 1000.0, {"stage": "prefill"})
            tokens = await ready(self.loop, 'engine loop').add(seq_id, result, params)
            del result  # the engine owns the KV now; don't pin it for the whole response
            timings = {"encode_ms": encode_ms, "prefill_ms": prefill_ms, "kv_transfer_ms": 0.0, "kv_bytes": 0.0,
                       "embedding_bytes": 0.0, "t_decode_in": t_in, "t_enc_out": t_enc, "t_emb_in": t_emb,
                       "t_prefill_end": t_pf}
            return await self.gm.stream(request, req, seq_id=seq_id, tokens=tokens,
                                        prompt_len=len(prompt.input_ids), loop=ready(self.loop, 'engine loop'),
                                        used_tokens=self.used_tokens, detok=self._detok,
                                        stop_ids=set(params.stop_token_ids), t_arrival=t_arrival,
                                        timings=timings)
        finally:
            self.used_tokens.pop(seq_id, None)
            self.slots.release()

    def _detok(self, ids: list[int]) -> str:
        return self.bundle.tokenizer.decode(ids, skip_special_tokens=True)

    async def on_ready(self) -> None:
        self.session = aiohttp.ClientSession()
        self.loop = EngineLoop(self.decode, asyncio.get_running_loop(), name="colocated-loop")
        self.loop.start()

    async def on_stop(self) -> None:
        if self.loop is not None:
            await asyncio.to_thread(self.loop.stop)
        if self.session is not None:
            await self.session.close()


async def run_colocated(args: Any) -> None:
    from epdctl.runtime.encoder_engine import VisionEncoder
    from epdctl.runtime.model import load_bundle
    from epdctl.runtime.prefill_engine import LanguagePrefill
    from epdctl.runtime.servers.common import serve

    bundle = await asyncio.to_thread(load_bundle, args.model_path, role="colocated")
    info = WorkerInfo(role="colocated", served_name=args.served_model_name or bundle.served_name,
                      model_path=args.model_path, transport=None,
                      max_running_requests=args.max_running_requests,
                      max_images_per_request=args.max_images_per_request,
                      context_length=int(bundle.config.text_config.max_position_embeddings),
                      api_key=api_key_from_env(getattr(args, "api_key_env", None)))
    path = paths.active()
    encoder = VisionEncoder(bundle, cache_mb=args.cache_mb, after_pass=path.after_images)
    server = ColocatedServer(args, bundle, encoder, LanguagePrefill(bundle),
                             path.decode_engine(bundle, args.max_running_requests), info)
    await serve([(server.app(), args.host, args.port)], server.on_ready, server.on_stop)
