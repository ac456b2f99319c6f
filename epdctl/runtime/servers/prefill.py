"""Prefill worker: images → encoders → prefill → KV handed to the decode of the same room.

The router waits for our answer before the client sees a first token, so we answer 200 as
soon as the prefill is done and hand the KV over in the background. A decode that asked for it
gets the first token ahead of the KV (a tiny message under ``first_key(room)``) and streams it
while the KV is on its way. A request that fails here
also fails its decode partner fast: the error is sent to the decode under the room's key
instead of letting it wait for a KV that will never come.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
from aiohttp import web

from epdctl.runtime.limits import limits_from_args
from epdctl.runtime.metrics import Registry
from epdctl.runtime.openai_api import ApiError, parse_chat_request
from epdctl.runtime import paths
from epdctl.runtime.servers.bootstrap import KVBootstrap
from epdctl.runtime.servers.busy import own_work_metrics
from epdctl.runtime.servers.admission import Admission
from epdctl.runtime.servers.common import (ModelThread, Served, Stopwatch, json_response, make_app, read_json,
                                           ready, to_api_error)
from epdctl.runtime.servers.encoder_client import EncoderClient
from epdctl.runtime.servers.info import WorkerInfo, add_info_routes, transport_metrics
from epdctl.runtime.servers.kv_handoff import KVHandoff
from epdctl.runtime.servers.native import add_native_routes, prefill_generate
from epdctl.runtime.servers.registry import EncoderRegistry, api_key_from_env, bootstrap_app

log = logging.getLogger(__name__)


class PrefillServer:
    def __init__(self, args: Any, bundle: Any, engine: Any, transport: Any, info: WorkerInfo):
        from epdctl.runtime import wire
        from epdctl.runtime.prompt import build_prompt
        from epdctl.runtime.sampling import SamplingParams

        self._wire, self._build_prompt, self._Sampling = wire, build_prompt, SamplingParams
        self.args = args
        self.bundle = bundle
        self.engine = engine
        self.transport = transport
        self.info = info
        self.thread = ModelThread("prefill")
        self.registry = EncoderRegistry(args.encoder_urls or [], probe_interval=args.encoder_probe_interval,
                                        api_key=api_key_from_env(args.api_key_env))
        self.bootstrap = KVBootstrap(route_ttl=max(4 * args.kv_timeout, 60.0),
                                     api_key=api_key_from_env(args.api_key_env))
        self.limits = limits_from_args(args)
        self.admission = Admission(self.limits, bundle, info.context_length)
        self.session: aiohttp.ClientSession | None = None
        self.encoders: EncoderClient | None = None
        self.running = 0
        self.metrics = Registry("epd_prefill")
        self._init_metrics()
        self.kv = KVHandoff(transport, wire, self.bootstrap, args.kv_timeout, args.bootstrap_port,
                            self.m_handoff, self.m_stage)

    def _init_metrics(self) -> None:
        m = self.metrics
        paths.active().add_metrics(m)
        self.m_requests = m.counter("requests_total", "Prefill requests by HTTP status")
        self.m_stage = m.histogram("stage_seconds", "Per-stage latency (fetch, encode, prefill, kv_send)")
        self.m_ttft = m.histogram("ttft_seconds", "Request arrival to first token (prefill done)")
        self.m_cache = m.counter("embedding_cache_total", "Images by encoder embedding-cache result")
        self.m_handoff = m.counter("kv_handoffs_total", "KV hand-offs by outcome (sent, no_decode, failed)")
        m.gauge("queue_depth", "Model calls waiting for the prefill thread", lambda: float(self.thread.pending))
        m.gauge("running_requests", "Requests being prefilled", lambda: float(self.running))
        own_work_metrics(m, self.thread.busy, lambda: self.thread.waiting)
        m.gauge("pending_kv_handoffs", "KV caches held while waiting for their decode", lambda: float(self.kv.held))
        m.gauge("healthy_encoders", "Encoders admitted by the registry", lambda: float(len(self.registry.healthy_urls())))
        self.inline = {"bytes_received": 0}  # embeddings that came as an encoder's /encode answer
        transport_metrics(m, self.transport, self.inline)

    def app(self) -> web.Application:
        app = make_app(self.limits.max_body_bytes)
        app.router.add_post("/v1/chat/completions", self.h_chat)
        self.registry.add_routes(app)
        add_native_routes(app, self, self.h_generate)
        add_info_routes(app, self.info, self.metrics, self.loads, self.health_generate)
        return app

    def encoder_bootstrap_app(self) -> web.Application:
        return bootstrap_app(self.registry, make_app(64 * 1024))

    async def h_generate(self, request: web.Request) -> web.Response:
        return await prefill_generate(self, request)

    def idle(self) -> bool:
        return self.running == 0 and self.thread.pending == 0 and self.kv.held == 0

    def loads(self) -> dict[str, int]:
        return {"num_running_reqs": self.running, "num_waiting_reqs": self.thread.pending,
                "num_used_tokens": self.kv.pending_tokens}

    async def health_generate(self) -> dict[str, Any]:
        """A real forward pass: text-only prefill of a short prompt."""
        prompt = await self.thread.run(self._build_prompt, self.bundle, [{"role": "user", "content": "hi"}], [])
        result = await self.thread.run(self.engine.prefill, prompt, [], self._Sampling(max_tokens=1))
        return {"prompt_tokens": result.prompt_len, "first_token": result.first_token}

    def sampling(self, req: Any) -> Any:
        return self._Sampling.for_answer(max_tokens=req.max_tokens, temperature=req.temperature,
                                         top_p=req.top_p, seed=req.seed, ignore_eos=req.ignore_eos,
                                         eos_token_ids=self.bundle.eos_token_ids)

    async def h_chat(self, request: web.Request) -> web.Response:
        t_arrival = time.perf_counter()
        body = await read_json(request)
        try:
            req = parse_chat_request(body, self.info.served_name, max_images=self.args.max_images_per_request,
                                     require_room=True, context_length=self.info.context_length)
            self.admission.text_tokens_at_least(req)
        except ApiError as err:
            self._fail_partner(body.get("bootstrap_room"), err)
            self.m_requests.inc(labels={"status": str(err.status)})
            raise
        room = str(req.bootstrap_room)
        self.running += 1
        try:
            result, timings = await self._prefill(req, t_arrival)
        except asyncio.CancelledError:
            self._fail_partner(room, ApiError(500, "the prefill request was cancelled (its caller went away)",
                                              "prefill_cancelled", "server_error"))
            raise
        except Exception as exc:
            failure = to_api_error(exc)
            self._fail_partner(room, failure)
            self.m_requests.inc(labels={"status": str(failure.status)})
            if failure.status >= 500:
                log.error("room %s: prefill failed: %s", room, failure.message)
            raise failure from None
        finally:
            self.running -= 1
        self.m_requests.inc(labels={"status": "200"})
        self.m_ttft.observe(time.perf_counter() - t_arrival)
        self._spawn(self._handoff(room, result, timings))
        # Let the KV leave before our answer is written: the router waits for the decode's first
        # token, which waits for the KV, while our answer is only a header it has to collect.
        await asyncio.sleep(0)
        return json_response({"status": "ok", "bootstrap_room": req.bootstrap_room,
                              "prompt_tokens": result.prompt_len, "timings": timings})

    async def _prefill(self, req: Any, t_arrival: float) -> tuple[Any, dict[str, float]]:
        watch = Stopwatch()
        trace = {"t_prefill_in": time.time() - (time.perf_counter() - t_arrival)}
        images = await self.admission.images(req, ready(self.session, 'HTTP client'))
        fetch_s = watch.lap() / 1000.0
        self.m_stage.observe(fetch_s, {"stage": "fetch"})
        trace["t_enc_out"] = time.time()
        encoded, emb_bytes = await ready(self.encoders, 'encoder client').encode(
            images, trace, allow_inline=not req.force_transport) if images else ([], 0)
        encode_ms = watch.lap()
        if images:
            self.m_stage.observe(encode_ms / 1000.0, {"stage": "encode"})
            for e in encoded:
                self.m_cache.inc(labels={"result": "hit" if e.cached else "miss"})
        grids, params = [e.grid_thw for e in encoded], self.sampling(req)

        def prompt_and_prefill() -> Any:  # one hop to the model thread, not two
            trace["t_prefill_start"] = time.time()
            prompt = self._build_prompt(self.bundle, req.messages, grids)
            self.admission.prompt(len(prompt.input_ids), req.max_tokens)
            return self.engine.prefill(prompt, encoded, params)

        result = await self.thread.run(prompt_and_prefill)
        trace["t_prefill_end"] = time.time()
        prefill_ms = watch.lap()
        self.m_stage.observe(prefill_ms / 1000.0, {"stage": "prefill"})
        timings = {"fetch_ms": fetch_s * 1000.0, "encode_ms": encode_ms, "prefill_ms": prefill_ms,
                   "embedding_bytes": float(emb_bytes),
                   "prefill_done_ms": (time.perf_counter() - t_arrival) * 1000, **trace}
        return result, timings

    def _spawn(self, coro: Any) -> None:
        self.kv.spawn(coro)

    async def _handoff(self, room: str, result: Any, timings: dict[str, float]) -> None:
        await self.kv.handoff(room, result, timings)

    def _fail_partner(self, room: Any, err: ApiError) -> None:
        self.kv.fail_partner(room, err)

    async def on_ready(self) -> None:
        self.session = aiohttp.ClientSession()
        self.encoders = EncoderClient(self.registry, self.session, self.transport, self._wire,
                                      timeout=self.args.encoder_timeout, inline=self.inline)
        self.registry.start(self.session)
        self.bootstrap.start()
        if not self.registry.encoders:
            log.info("no --encoder-urls: waiting for encoders to register on port %d",
                     self.args.encoder_bootstrap_port)

    async def on_stop(self) -> None:
        await self.registry.stop()
        await self.bootstrap.stop()
        await self.kv.stop()
        if self.encoders is not None:
            await self.encoders.close()
        if self.session is not None:
            await self.session.close()
        await self.transport.close()
        self.thread.shutdown()


async def build_prefill(args: Any, bundle: Any) -> Served:
    """The prefill's servers around a loaded model (``bundle`` keeps at least the language model)."""
    from epdctl.runtime.prefill_engine import LanguagePrefill
    from epdctl.runtime.transports import open_transport

    engine = LanguagePrefill(bundle)
    transport = open_transport(args.transport, args.host, port=args.transfer_port, ib_device=args.ib_device,
                               shm=paths.active().shm)
    await transport.start()
    info = WorkerInfo(role="prefill", served_name=args.served_model_name or bundle.served_name,
                      model_path=args.model_path, transport=args.transport,
                      max_running_requests=args.max_running_requests,
                      max_images_per_request=args.max_images_per_request,
                      context_length=int(bundle.config.text_config.max_position_embeddings),
                      api_key=api_key_from_env(getattr(args, "api_key_env", None)),
                      bootstrap_port=args.bootstrap_port, encoder_bootstrap_port=args.encoder_bootstrap_port)
    server = PrefillServer(args, bundle, engine, transport, info)
    extra = [(server.bootstrap.app(), args.host, args.bootstrap_port),
             (server.encoder_bootstrap_app(), args.host, args.encoder_bootstrap_port)]
    return Served("prefill", server, server.app(), extra, server.on_ready, server.on_stop, idle=server.idle)


async def run_prefill(args: Any) -> None:
    from epdctl.runtime.model import load_bundle
    from epdctl.runtime.servers.common import serve

    bundle = await asyncio.to_thread(load_bundle, args.model_path, role="prefill")
    s = await build_prefill(args, bundle)
    await serve(s.apps(args.host, args.port), s.on_ready, s.on_stop)
