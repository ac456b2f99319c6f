"""Decode worker: claim the room's KV from the prefill, then stream tokens to the client.

One thread drives ``DecodeEngine.step()`` (continuous batching); each request only waits on
its own token queue. The KV wait is bounded by ``--kv-timeout`` (kv_receive.py). A chat request
asks the prefill for its first token ahead of the KV and streams it at once; the sequence joins
the batch when the KV lands (early_first.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any, AsyncIterator

import aiohttp
from aiohttp import web

from epdctl.runtime.metrics import Registry
from epdctl.runtime.openai_api import ApiError, check_context, parse_chat_request
from epdctl.runtime import paths
from epdctl.runtime.servers.busy import own_work_metrics
from epdctl.runtime.servers.common import Served, make_app, read_json, ready
from epdctl.runtime.servers.early_first import stream_early
from epdctl.runtime.servers.engine_loop import EngineLoop
from epdctl.runtime.servers.info import WorkerInfo, add_info_routes, transport_metrics
from epdctl.runtime.servers.kv_receive import KVReceiver, kv_arrival, prefill_timings
from epdctl.runtime.servers import loop_trace
from epdctl.runtime.servers.native import add_native_routes, decode_generate
from epdctl.runtime.servers.registry import api_key_from_env, bearer
from epdctl.runtime.servers.respond import Generation, respond

log = logging.getLogger(__name__)


class GenerationMetrics:
    """TTFT/TPOT histograms and request outcomes, shared by decode and colocated workers."""

    def __init__(self, m: Registry):
        self.requests = m.counter("requests_total", "Chat requests by HTTP status")
        self.ttft = m.histogram("ttft_seconds", "Request arrival to first token")
        self.tpot = m.histogram("tpot_seconds", "Time per output token after the first")
        self.stage = m.histogram("stage_seconds", "Per-stage latency (kv_wait, decode, ...)")
        self.tokens = m.counter("generated_tokens_total", "Tokens generated")
        self.disconnects = m.counter("client_disconnects_total", "Clients that left mid-request (sequence aborted)")

    async def respond(self, request: web.Request, gen: Generation) -> tuple[web.StreamResponse, Any]:
        try:
            resp, out = await respond(request, gen)
        except (ConnectionResetError, asyncio.CancelledError):
            self.disconnects.inc()
            raise
        self.record(out)
        return resp, out

    async def stream(self, request: web.Request, req: Any, *, seq_id: str, tokens: Any, prompt_len: int,
                     loop: EngineLoop, used_tokens: dict[str, int], detok: Any, stop_ids: set[int],
                     t_arrival: float, timings: dict[str, float]) -> web.StreamResponse:
        """Answer one sequence already added to ``loop``, counting its KV tokens in ``used_tokens``.

        Shared by decode and colocated workers so `/v1/loads` and the metrics mean the same in both.
        """
        used_tokens[seq_id] = prompt_len
        trace = loop.trace

        def on_token(_: int) -> None:
            used_tokens[seq_id] = used_tokens.get(seq_id, 0) + 1
            if trace is not None:
                trace.token(seq_id)

        gen = Generation(seq_id=seq_id, req=req, tokens=tokens, prompt_len=prompt_len, stop_ids=stop_ids,
                         decode=detok, abort=loop.abort, t_arrival=t_arrival, timings=timings,
                         on_token=on_token)
        resp, _ = await self.respond(request, gen)
        return resp

    def record(self, out: Any) -> None:
        if out.ttft_s is not None:
            self.ttft.observe(out.ttft_s)
        if out.tpot_s is not None:
            self.tpot.observe(out.tpot_s)
        self.tokens.inc(out.completion_tokens)
        self.stage.observe(out.timings.get("decode_ms", 0.0) / 1000.0, {"stage": "decode"})


class DecodeServer:
    def __init__(self, args: Any, bundle: Any, engine: Any, transport: Any, info: WorkerInfo):
        from epdctl.runtime import wire
        from epdctl.runtime.sampling import SamplingParams

        self._wire, self._Sampling = wire, SamplingParams
        self.args = args
        self.bundle = bundle
        self.engine = engine
        self.transport = transport
        self.info = info
        self.info_auth = bearer(info.api_key)  # for the prefills' KV bootstrap
        self.loop: EngineLoop | None = None
        self.slots = asyncio.Semaphore(args.max_running_requests)
        self.waiting_slot = 0
        self.used_tokens: dict[str, int] = {}
        self.session: aiohttp.ClientSession | None = None
        self.metrics = Registry("epd_decode")
        self.gm = GenerationMetrics(self.metrics)
        self.m_kv = self.metrics.counter("kv_receive_total", "KV receptions by outcome (ok, timeout, error, late, lost)")
        self.kv = KVReceiver(transport, args.kv_timeout, self.info_auth, self.m_kv)
        m = self.metrics
        paths.active().add_metrics(m)
        m.gauge("running_requests", "Sequences being decoded", lambda: float(self.loop.num_running if self.loop else 0))
        m.gauge("queue_depth", "Requests waiting for their KV or a decode slot",
                lambda: float(self.kv.waiting + self.waiting_slot))
        own_work_metrics(m, self._busy, lambda: self.waiting_slot)
        transport_metrics(m, self.transport)

    def _busy(self) -> float:
        return self.loop.busy.total() if self.loop is not None else 0.0

    def app(self) -> web.Application:
        app = make_app(self.args.max_body_bytes)
        app.router.add_post("/v1/chat/completions", self.h_chat)
        add_native_routes(app, self, self.h_generate)
        add_info_routes(app, self.info, self.metrics, self.loads, self.health_generate)
        return app

    async def h_generate(self, request: web.Request) -> web.Response:
        return await decode_generate(self, request)

    def idle(self) -> bool:
        return all(v == 0 for v in self.loads().values()) and not self.kv.late

    def loads(self) -> dict[str, int]:
        return {"num_running_reqs": self.loop.num_running if self.loop else 0,
                "num_waiting_reqs": self.kv.waiting + self.waiting_slot,
                "num_used_tokens": sum(self.used_tokens.values())}

    async def health_generate(self) -> dict[str, Any]:
        """A real two-token generation: local prefill of a short prompt, then one decode step."""
        from epdctl.runtime.prefill_engine import LanguagePrefill
        from epdctl.runtime.prompt import build_prompt

        params = self._Sampling(max_tokens=2, stop_token_ids=[])

        def prefill() -> Any:
            prompt = build_prompt(self.bundle, [{"role": "user", "content": "hi"}], [])
            return LanguagePrefill(self.bundle).prefill(prompt, [], params)

        result = await ready(self.loop, 'decode loop').call(prefill)
        q = await ready(self.loop, 'decode loop').add("health-" + uuid.uuid4().hex, result, params)
        tokens = []
        while True:
            item = await asyncio.wait_for(q.get(), 30)
            if isinstance(item, BaseException) or not isinstance(item, tuple):
                raise ApiError(503, f"health generation failed: {item}", "unhealthy")
            tokens.append(item[0])
            if item[1]:
                return {"tokens": tokens}

    async def h_chat(self, request: web.Request) -> web.StreamResponse:
        t_arrival = time.perf_counter()
        try:
            # the image limit is the prefill's to enforce: it sends its error here under the room
            req = parse_chat_request(await read_json(request), self.info.served_name,
                                     max_images=1 << 30, require_room=True,
                                     context_length=self.info.context_length)
            if not req.bootstrap_host or req.bootstrap_port is None:
                raise ApiError(400, "missing 'bootstrap_host'/'bootstrap_port': the decode must know the prefill's "
                                    "bootstrap server (the PD router adds them)", "missing_field")
            got = await self.kv.receive(req, early=True)
            if got.kv is not None:  # the first token came ahead of the KV
                resp = await stream_early(self, request, req, got, t_arrival)
            else:
                resp = await self._generate(request, req, got.meta, got.tensors, got.wait_ms, t_arrival)
        except ApiError as err:
            self.gm.requests.inc(labels={"status": str(err.status)})
            raise
        self.gm.requests.inc(labels={"status": "200"})
        return resp

    async def _receive_kv(self, req: Any) -> tuple[dict, dict, float]:
        """The room's KV (no early first token): (meta, tensors, wait ms); for native /generate."""
        got = await self.kv.receive(req)
        return got.meta, got.tensors, got.wait_ms

    def sampling(self, req: Any) -> Any:
        return self._Sampling.for_answer(max_tokens=req.max_tokens, temperature=req.temperature,
                                         top_p=req.top_p, seed=req.seed, ignore_eos=req.ignore_eos,
                                         eos_token_ids=self.bundle.eos_token_ids)

    @contextlib.asynccontextmanager
    async def sequence(self, room: Any, meta: dict, tensors: dict, params: Any,
                       seq_id: str | None = None) -> AsyncIterator[tuple[str, Any, float]]:
        """The room's received KV as a running sequence: (seq_id, token queue, KV bytes). Waits
        for a decode slot (counted in queue_depth meanwhile); the slot and the sequence's
        /v1/loads tokens are given back however the answer ends. Shared by chat and /generate."""
        check_context(int(meta.get("prompt_len", 0)), params.max_tokens, self.info.context_length)
        result = self._wire.tensors_to_prefill_result(meta, tensors)
        kv_bytes = float(sum(t.numel() * t.element_size() for t in tensors.values()))
        tensors.clear()
        seq_id = seq_id or f"{room}-{uuid.uuid4().hex[:8]}"
        self.waiting_slot += 1
        try:
            await self.slots.acquire()
        finally:
            self.waiting_slot -= 1
        try:
            tokens = await ready(self.loop, 'decode loop').add(seq_id, result, params)
            del result  # the engine owns the KV now; don't pin it for the whole response
            yield seq_id, tokens, kv_bytes
        finally:
            self.used_tokens.pop(seq_id, None)
            self.slots.release()

    async def _generate(self, request: web.Request, req: Any, meta: dict, tensors: dict, kv_wait_ms: float,
                        t_arrival: float) -> web.StreamResponse:
        params = self.sampling(req)
        timings = {**prefill_timings(meta), **kv_arrival(meta, kv_wait_ms)}
        timings["t_decode_in"] = timings["t_kv_in"] - (time.perf_counter() - t_arrival)
        self.gm.stage.observe(kv_wait_ms / 1000.0, {"stage": "kv_wait"})
        async with self.sequence(req.bootstrap_room, meta, tensors, params) as (seq_id, tokens, kv_bytes):
            timings["kv_bytes"] = kv_bytes
            return await self.gm.stream(request, req, seq_id=seq_id, tokens=tokens,
                                        prompt_len=int(meta.get("prompt_len", 0)), loop=ready(self.loop, 'decode loop'),
                                        used_tokens=self.used_tokens, detok=self._detok,
                                        stop_ids=set(params.stop_token_ids), t_arrival=t_arrival,
                                        timings=timings)

    def _detok(self, ids: list[int]) -> str:
        return self.bundle.tokenizer.decode(ids, skip_special_tokens=True)

    async def on_ready(self) -> None:
        # no pool limit: every request waiting for its first token holds a connection to its prefill
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        self.kv.session = self.session
        self.loop = EngineLoop(self.engine, asyncio.get_running_loop())
        self.loop.trace = loop_trace.from_env()
        self.loop.start()

    async def on_stop(self) -> None:
        for task in list(self.kv.late):
            task.cancel()
        if self.loop is not None:
            await asyncio.to_thread(self.loop.stop)
            if self.loop.trace is not None:
                self.loop.trace.dump()
        if self.session is not None:
            await self.session.close()
        await self.transport.close()


async def build_decode(args: Any, bundle: Any) -> Served:
    """The decode's servers around a loaded model (``bundle`` keeps at least the language model)."""
    from epdctl.runtime.transports import open_transport

    engine = paths.active().decode_engine(bundle, args.max_running_requests)
    transport = open_transport(args.transport, args.host, port=args.transfer_port, ib_device=args.ib_device,
                               shm=paths.active().shm)
    await transport.start()
    info = WorkerInfo(role="decode", served_name=args.served_model_name or bundle.served_name,
                      model_path=args.model_path, transport=args.transport,
                      max_running_requests=args.max_running_requests,
                      max_images_per_request=args.max_images_per_request,
                      context_length=int(bundle.config.text_config.max_position_embeddings),
                      api_key=api_key_from_env(getattr(args, "api_key_env", None)))
    server = DecodeServer(args, bundle, engine, transport, info)
    return Served("decode", server, server.app(), [], server.on_ready, server.on_stop, idle=server.idle)


async def run_decode(args: Any) -> None:
    from epdctl.runtime.model import load_bundle
    from epdctl.runtime.servers.common import serve

    bundle = await asyncio.to_thread(load_bundle, args.model_path, role="decode")
    s = await build_decode(args, bundle)
    await serve(s.apps(args.host, args.port), s.on_ready, s.on_stop)
