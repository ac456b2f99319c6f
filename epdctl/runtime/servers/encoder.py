"""Encoder worker: ``POST /encode`` → vision tower → embeddings pushed to the prefill's transport
(or, when small and the prefill asked, returned as the answer itself: encode_api.py).

Concurrent requests (from one or many prefills) are collected for a few milliseconds and run
as one ``VisionEncoder.encode`` call, so the vision tower sees one batch instead of many small
ones. If a batch fails on one bad image, its requests are re-run one by one so only the
request that sent the bad image gets the 400.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from epdctl.runtime.errors import BadRequestError
from epdctl.runtime.limits import Limits, limits_from_args
from epdctl.runtime.metrics import Registry
from epdctl.runtime.openai_api import ApiError
from epdctl.runtime import paths
from epdctl.runtime.servers.common import (ModelThread, Served, json_response, make_app, read_json, serve,
                                           ready, to_api_error)
from epdctl.runtime.servers.auth import require_bearer
from epdctl.runtime.servers.busy import own_work_metrics
from epdctl.runtime.servers.encode_api import INLINE_TYPE, check_pixels, inline_body, parse_encode
from epdctl.runtime.servers.registry import api_key_from_env, bearer

log = logging.getLogger(__name__)


@dataclass
class _Job:
    images: list[bytes]
    pixels: int = 0
    future: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class EncodeBatcher:
    """Gathers concurrent encode jobs into one model call (bounded by images and wait time)."""

    def __init__(self, encoder: Any, thread: ModelThread, max_batch_images: int, wait_s: float,
                 max_batch_pixels: int = 1 << 62):
        self.encoder = encoder
        self.max_batch_pixels = max_batch_pixels
        self.thread = thread
        self.max_batch_images = max(1, max_batch_images)
        self.wait_s = wait_s
        self.queue: asyncio.Queue[_Job] = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self._held: _Job | None = None
        self.batches = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def encode(self, images: list[bytes], pixels: int = 0) -> list[Any]:
        job = _Job(images, pixels)
        await self.queue.put(job)
        return await job.future

    async def _loop(self) -> None:
        while True:
            jobs = [self._held or await self.queue.get()]
            self._held = None
            deadline = time.monotonic() + self.wait_s  # 0 (default): an idle encoder starts at once
            while self._held is None and sum(len(j.images) for j in jobs) < self.max_batch_images:
                if not self.queue.empty():  # whatever queued during the last pass joins at once
                    job = self.queue.get_nowait()
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    try:
                        job = await asyncio.wait_for(self.queue.get(), left)
                    except asyncio.TimeoutError:
                        break
                if sum(j.pixels for j in jobs) + job.pixels > self.max_batch_pixels:
                    self._held = job  # decoded pixels of one batch stay bounded: next batch
                else:
                    jobs.append(job)
            await self._run(jobs)

    async def _run(self, jobs: list[_Job]) -> None:
        self.batches += 1
        flat = [img for job in jobs for img in job.images]
        try:
            results = await self.thread.run(self.encoder.encode, flat)
        except Exception as exc:
            if len(jobs) > 1 and isinstance(exc, BadRequestError):
                for job in jobs:  # isolate the request with the bad image
                    await self._run([job])
                return
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(exc)
            return
        k = 0
        for job in jobs:
            if not job.future.done():
                job.future.set_result(results[k:k + len(job.images)])
            k += len(job.images)


class EncoderServer:
    def __init__(self, args: Any, encoder: Any, transport: Any, wire: Any):
        self.args = args
        self.encoder = encoder
        self.transport = transport
        self.wire = wire
        self.thread = ModelThread("encoder")
        self.limits: Limits = limits_from_args(args)
        self.api_key = api_key_from_env(getattr(args, "api_key_env", None))
        self.batcher = EncodeBatcher(encoder, self.thread, args.max_batch_size, args.batch_wait_ms / 1000.0,
                                     max_batch_pixels=self.limits.max_request_pixels)
        self.session: aiohttp.ClientSession | None = None
        self.metrics = Registry("epd_encoder")
        self._register_task: asyncio.Task | None = None
        self.inflight = 0
        self.inline = {"answers": 0, "bytes": 0}  # embeddings returned as the /encode answer itself
        self._init_metrics()

    def _init_metrics(self) -> None:
        m = self.metrics
        paths.active().add_metrics(m)
        self.m_requests = m.counter("requests_total", "Encode requests by outcome")
        self.m_latency = m.histogram("encode_seconds", "Time from /encode arrival to embeddings sent")
        self.m_batch = m.histogram("batch_images", "Images per vision-tower batch",
                                   buckets=(1, 2, 4, 8, 16, 32, 64, 128))
        stats = lambda k: (lambda: float(self.encoder.stats.get(k, 0)))  # noqa: E731
        m.counter_fn("cache_hits_total", "Embedding-cache hits", stats("cache_hits"))
        m.counter_fn("cache_misses_total", "Embedding-cache misses", stats("cache_misses"))
        m.gauge("cache_bytes", "Bytes held by the embedding cache", stats("cache_bytes"))
        m.counter_fn("vision_seconds_total", "Seconds spent in the vision tower", stats("vision_seconds"))
        m.gauge("queue_depth", "Encode jobs waiting for a batch", lambda: float(self.batcher.queue.qsize()))
        own_work_metrics(m, self.thread.busy, lambda: self.batcher.queue.qsize())
        tstat = lambda k: (lambda: float(self.transport.stats.get(k, 0)))  # noqa: E731
        m.counter_fn("transport_bytes_sent_total", "Embedding bytes sent to prefills over the transport",
                     tstat("bytes_sent"))
        m.counter_fn("inline_bytes_sent_total", "Embedding bytes sent as the /encode answer itself (small ones)",
                     lambda: float(self.inline["bytes"]))
        m.counter_fn("inline_answers_total", "Embeddings returned inline in the /encode answer (small ones)",
                     lambda: float(self.inline["answers"]))
        m.counter_fn("transport_failures_total", "Failed transport sends", tstat("failures"))

    def app(self) -> web.Application:
        app = make_app(self.limits.max_body_bytes)
        app.router.add_post("/encode", self.h_encode)
        app.router.add_get("/health", self.h_health)
        app.router.add_get("/health_generate", self.h_health)
        app.router.add_get("/metrics", self.h_metrics)
        return app

    async def h_health(self, _: web.Request) -> web.Response:
        return json_response({"status": "ok", "role": "encoder"})

    async def h_metrics(self, request: web.Request) -> web.Response:
        require_bearer(request, self.api_key, "/metrics")
        return web.Response(text=self.metrics.render(), content_type="text/plain")

    def idle(self) -> bool:
        return self.inflight == 0 and self.batcher.queue.qsize() == 0 and self.thread.pending == 0

    async def h_encode(self, request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        t_in = time.time()
        self.inflight += 1
        try:
            key, reply_to, images, inline_max = parse_encode(await read_json(request), self.limits)
            pixels = check_pixels(images, self.limits)
            results = await self.batcher.encode(images, pixels)
            meta, tensors = self.wire.embeds_to_tensors(results)
            meta["trace"] = {"t_enc_in": t_in, "t_enc_send": time.time()}  # wall clock, same host: comparable
            nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
            if nbytes <= inline_max:  # the answer itself (encode_api.py)
                body = inline_body(self.wire.pack(meta, tensors))
                self.inline["answers"] += 1
                self.inline["bytes"] += len(body)
            else:
                body = None
                nbytes = await self.transport.send(reply_to, key, meta, tensors)
        except Exception as exc:
            err = to_api_error(exc)
            self.m_requests.inc(labels={"outcome": str(err.status)})
            if err.status >= 500:
                log.error("encode failed: %s", err.message)
            raise err from None
        finally:
            self.inflight -= 1
        self.m_batch.observe(len(images))
        self.m_requests.inc(labels={"outcome": "200"})
        elapsed = time.perf_counter() - t0
        self.m_latency.observe(elapsed)
        if body is not None:
            return web.Response(body=body, content_type=INLINE_TYPE)
        return json_response({"key": key, "num_images": len(results), "cached": [r.cached for r in results],
                              "nbytes": nbytes, "encode_ms": elapsed * 1000.0})

    def public_url(self) -> str:
        host = self.args.host
        if host in ("0.0.0.0", "::", ""):
            host = socket.getfqdn()
        return f"http://{host}:{self.args.port}"

    async def _register_loop(self, refresh_s: float = 10.0) -> None:
        """Register with every prefill registry and keep doing so (registration is idempotent):
        prefills may start after us, or restart and forget us."""
        known: set[str] = set()
        delay = 0.5
        while True:
            for base in self.args.register_urls:
                ok = await self._register(base)
                if ok and base not in known:
                    log.info("registered with %s", base)
                elif not ok and base in known:
                    log.warning("lost contact with the registry at %s; retrying", base)
                (known.add if ok else known.discard)(base)
            delay = refresh_s if len(known) == len(self.args.register_urls) else min(delay * 2, 5.0)
            await asyncio.sleep(delay)

    async def _register(self, base: str) -> bool:
        try:
            async with ready(self.session, 'HTTP client').post(base.rstrip("/") + "/register_encoder_url", json={"url": self.public_url()},
                                         headers=bearer(self.api_key),
                                         timeout=aiohttp.ClientTimeout(total=5)) as resp:
                if resp.status == 401:
                    log.error("the registry at %s refused our API key (check --api-key-env)", base)
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False

    async def _unregister(self) -> None:
        for base in self.args.register_urls or []:
            try:
                async with ready(self.session, 'HTTP client').delete(base.rstrip("/") + "/unregister_encoder_url",
                                               json={"url": self.public_url()}, headers=bearer(self.api_key),
                                               timeout=aiohttp.ClientTimeout(total=2)):
                    pass
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                log.warning("could not unregister from %s", base)

    async def on_ready(self) -> None:
        self.session = aiohttp.ClientSession()
        self.batcher.start()
        if self.args.register_urls:
            self._register_task = asyncio.create_task(self._register_loop())

    async def on_drain(self) -> None:
        """Leave the prefills' registries first, so no new work is sent while we drain."""
        if self._register_task is not None:
            self._register_task.cancel()
        if self.session is not None:
            await self._unregister()

    async def on_stop(self) -> None:
        if self.session is not None:
            await self.session.close()
        await self.batcher.stop()
        await self.transport.close()
        self.thread.shutdown()


async def build_encoder(args: Any, bundle: Any) -> Served:
    """The encoder's servers around a loaded model (``bundle`` keeps at least the vision tower)."""
    from epdctl.runtime import wire
    from epdctl.runtime.encoder_engine import VisionEncoder
    from epdctl.runtime.transports import open_transport

    encoder = VisionEncoder(bundle, cache_mb=args.cache_mb, after_pass=paths.active().after_images)
    transport = open_transport(args.transport, args.host, port=args.transfer_port, ib_device=args.ib_device,
                               shm=paths.active().shm)
    await transport.start()
    server = EncoderServer(args, encoder, transport, wire)
    return Served("encoder", server, server.app(), [], server.on_ready, server.on_stop, server.on_drain,
                  idle=server.idle)


async def run_encoder(args: Any) -> None:
    from epdctl.runtime.model import load_bundle

    bundle = await asyncio.to_thread(load_bundle, args.model_path, role="encoder")
    s = await build_encoder(args, bundle)
    await serve(s.apps(args.host, args.port), s.on_ready, s.on_stop, s.on_drain)
