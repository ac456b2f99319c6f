"""Pieces every worker app shares: error middleware, JSON helpers, serving with a clean stop.

Every error a client can cause leaves as an OpenAI-style JSON body with the right status; an
unexpected exception is logged with its traceback and answered 500, never crashing the worker.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import signal
import time
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Awaitable, Callable, TypeVar

from aiohttp import web

from epdctl.runtime import paths
from epdctl.runtime.errors import BadRequestError, RuntimeWorkerError, TransferError
from epdctl.runtime.limits import DEFAULT_MAX_BODY_BYTES
from epdctl.runtime.servers.busy import BusyClock
from epdctl.runtime.openai_api import ApiError, decode_json, error_body
from epdctl.runtime.servers import listen

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
BODY_LIMIT = web.AppKey("max_body_bytes", int)


def version() -> str:
    try:
        return metadata.version("epdctl")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(obj), content_type="application/json")


def error_response(err: ApiError) -> web.Response:
    return json_response(err.body(), err.status)


def to_api_error(exc: BaseException) -> ApiError:
    """Map the runtime's own exceptions to HTTP errors."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, BadRequestError):
        status = getattr(exc, "status", 400)
        return ApiError(status, getattr(exc, "message", str(exc)))
    if isinstance(exc, TransferError):
        return ApiError(502, f"transfer failed: {exc}", "transfer_failed")
    if isinstance(exc, asyncio.TimeoutError):
        return ApiError(504, "timed out", "timeout")
    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", "internal_error", "server_error")


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status)
        return json_response(error_body(f"{exc.reason}: {request.method} {request.path}",
                                        "invalid_request_error", code), exc.status)
    except (ApiError, BadRequestError) as exc:
        return error_response(to_api_error(exc))
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if isinstance(exc, ConnectionResetError) and (request.transport is None
                                                      or request.transport.is_closing()):
            raise  # our client went away before the answer: aiohttp drops the connection quietly
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(to_api_error(exc))


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, or ApiError(400/413)."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        limit = request.client_max_size  # the app's make_app(max_body_bytes), or a switchable role's
        raise ApiError(413, f"request body is larger than the limit of {limit} bytes (limits.max_body_bytes)",
                       "request_too_large") from None
    try:
        return decode_json(raw)
    finally:
        paths.active().after_body(len(raw))


def make_app(max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> web.Application:
    """An app whose request bodies stop at ``max_body_bytes`` (413 before the rest is read)."""
    app = web.Application(middlewares=[error_middleware], client_max_size=max_body_bytes)
    app[BODY_LIMIT] = max_body_bytes
    return app


class ModelThread:
    """One thread that runs every model call of a worker, in arrival order.

    torch releases the GIL inside kernels, so the event loop keeps answering /health while a
    forward pass runs; one thread means model state (e.g. rope deltas) is never shared.
    """

    def __init__(self, name: str):
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.pending = 0
        self.busy = BusyClock()  # wall time the thread spends running calls (the role's own work)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        self.pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, self._timed, fn, args)
        finally:
            self.pending -= 1

    def _timed(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        with self.busy:
            return fn(*args)

    @property
    def waiting(self) -> int:
        """Calls queued behind the one running now."""
        return max(0, self.pending - (1 if self.busy.active else 0))

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class Stopwatch:
    """Milliseconds since creation, for the per-stage ``timings``."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1000.0

    def lap(self) -> float:
        now = time.perf_counter()
        out = (now - self.t0) * 1000.0
        self.t0 = now
        return out


_T = TypeVar("_T")


def ready(value: _T | None, what: str) -> _T:
    """``value`` once the worker's ``on_ready`` set it; before that a 503 that says so (a request
    that raced the worker's start), never an AttributeError on None."""
    if value is None:
        raise ApiError(503, f"the worker is still starting ({what} not ready yet); retry in a moment", "not_ready")
    return value


@dataclass
class Served:
    """One role's servers, built around an already loaded model (switchable workers rebuild it)."""

    role: str
    server: Any
    app: web.Application                                     # served on --port
    extra: list[tuple[web.Application, str, int]] = field(default_factory=list)  # bootstrap ports
    on_ready: Callable[[], Awaitable[None]] | None = None
    on_stop: Callable[[], Awaitable[None]] | None = None
    on_drain: Callable[[], Awaitable[None]] | None = None
    idle: Callable[[], bool] = lambda: True                  # nothing queued or in flight

    def apps(self, host: str, port: int) -> list[tuple[web.Application, str, int]]:
        return [(self.app, host, port), *self.extra]


async def start_runners(apps: list[tuple[web.Application, str, int]],
                        drain_timeout: float = 15.0, ready: bool = True) -> list[web.AppRunner]:
    """Bind every (app, host, port) first (RuntimeWorkerError with a one-line reason if one
    cannot), tell the supervisor this worker is ready (listen.py; ``ready=False``: not yet, the
    caller has more to start), then serve them."""
    socks = []
    runners: list[web.AppRunner] = []
    try:
        for _, host, port in apps:
            socks.append(listen.bind(host, port))
        if ready:
            listen.notify_ready()
        for (app, host, port), sock in zip(apps, socks):
            runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=drain_timeout,
                                   handler_cancellation=True)  # a gone client cancels its handler
            await runner.setup()
            runners.append(runner)
            await web.SockSite(runner, sock).start()
            log.info("listening on http://%s:%d", host, port)
    except BaseException:
        await stop_runners(runners)
        for sock in socks:
            sock.close()
        raise
    return runners


async def stop_runners(runners: list[web.AppRunner]) -> None:
    for runner in reversed(runners):
        await runner.cleanup()


async def serve(apps: list[tuple[web.Application, str, int]],
                on_ready: Callable[[], Awaitable[None]] | None = None,
                on_stop: Callable[[], Awaitable[None]] | None = None,
                on_drain: Callable[[], Awaitable[None]] | None = None,
                drain_timeout: float = 15.0) -> None:
    """Bind every (app, host, port), run until SIGTERM/SIGINT, then stop gracefully.

    Stopping: ``on_drain`` (tell peers we are leaving), stop listening and let in-flight requests
    finish (up to ``drain_timeout``), then ``on_stop`` (close engines and transports).
    A port that cannot be bound raises RuntimeWorkerError with a one-line reason.
    """
    runners: list[web.AppRunner] = []
    stop = stop_event()
    try:
        runners = await start_runners(apps, drain_timeout)
        if on_ready is not None:
            await on_ready()
        paths.active().serving()
        await stop.wait()
        log.info("stopping (signal received): finishing in-flight requests")
    finally:
        await quietly(on_drain)
        await stop_runners(runners)
        await quietly(on_stop)


def stop_event() -> asyncio.Event:
    """An event set by SIGTERM/SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def quietly(step: Callable[[], Awaitable[None]] | None) -> None:
    if step is None:
        return
    try:
        await step()
    except Exception:
        log.exception("error while stopping")
