"""A switchable worker: one process, one model load, a role that changes in place.

Started with ``--switchable``, an encoder/prefill/decode worker loads the whole checkpoint
(vision tower and language model) and serves its role through a dispatcher that stays bound to
``--port``. ``POST /admin/switch_role {"argv": [<role>, <flags>...]}`` (the new role's own
command line, as epdctl renders it) tears the old role's servers down after checking it is idle
(the control plane drains it first) and builds the new role's around the same weights: its
HTTP routes on the same port, its bootstrap servers and encoder registry on its own ports, a
new transport (the old one is closed first, so the new one can bind the same ``--transfer-port``:
a rebalanced worker keeps its transfer port in every role). Counters and histograms continue where the role last left them; the switch
itself is counted in ``epd_worker_role_switches_total``. With ``--api-key-env`` set, the admin
route needs ``Authorization: Bearer KEY`` like the encoder registry.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from aiohttp import web

from epdctl.runtime import paths
from epdctl.runtime.metrics import Registry
from epdctl.runtime.openai_api import ApiError
from epdctl.runtime.servers.auth import require_bearer
from epdctl.runtime.servers.common import (BODY_LIMIT, Served, json_response, make_app, quietly, read_json,
                                           start_runners, stop_event, stop_runners)

log = logging.getLogger(__name__)

SWITCH_PATH = "/admin/switch_role"
ROLES = ("encoder", "prefill", "decode")
Parse = Callable[[list[str]], Any]


async def build_role(args: Any, bundle: Any) -> Served:
    if args.role == "encoder":
        from epdctl.runtime.servers.encoder import build_encoder
        return await build_encoder(args, bundle)
    if args.role == "prefill":
        from epdctl.runtime.servers.prefill import build_prefill
        return await build_prefill(args, bundle)
    from epdctl.runtime.servers.decode import build_decode
    return await build_decode(args, bundle)


class RoleHost:
    """The dispatcher on ``--port`` and the role currently behind it."""

    def __init__(self, args: Any, bundle: Any, parse: Parse,
                 build: Callable[[Any, Any], Awaitable[Served]] = build_role):
        self.args = args
        self.key_env: str | None = getattr(args, "api_key_env", None)  # fixed at start, not by a switch
        self.bundle = bundle
        self.parse = parse
        self.build = build
        self.current: Served | None = None
        self.extra: list[web.AppRunner] = []
        self.lock = asyncio.Lock()
        self.registries: dict[str, Registry] = {}
        self.metrics = Registry("epd_worker", process=False)
        self.m_switch = self.metrics.counter("role_switches_total", "In-place role switches by outcome")
        self.m_seconds = self.metrics.histogram("role_switch_seconds", "Old role down to new role serving")
        self.role_gauge = self.metrics.gauge("role_info", "1 for the role this process serves now")

    def app(self) -> web.Application:
        app = make_app()
        app.router.add_post(SWITCH_PATH, self.h_switch)
        app.router.add_get("/metrics", self.h_metrics)
        app.router.add_route("*", "/{tail:.*}", self.dispatch)
        return app

    # -- serving -------------------------------------------------------------------------------

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        served = self.current
        if served is None:
            raise ApiError(503, "this worker is switching roles; retry in a moment", "switching")
        match = await served.app.router.resolve(request)
        if match.http_exception is not None:
            raise match.http_exception
        limit = served.app.get(BODY_LIMIT)  # the role's own body limit (make_app(max_body_bytes))
        if limit is not None and limit != request.client_max_size:
            request = request.clone(client_max_size=limit)
        return await match.handler(request)

    async def h_metrics(self, request: web.Request) -> web.Response:
        require_bearer(request, os.environ.get(self.key_env) if self.key_env else None, "/metrics")
        role = self.current.role if self.current else ""
        for r in ROLES:
            self.role_gauge.set(float(r == role), {"role": r})
        body = self.metrics.render()
        if self.current is not None:
            body += self.current.server.metrics.render()
        return web.Response(text=body, content_type="text/plain")

    # -- switching -----------------------------------------------------------------------------

    def authorize(self, request: web.Request) -> None:
        require_bearer(request, os.environ.get(self.key_env) if self.key_env else None, "switching roles")

    def _new_args(self, body: dict[str, Any]) -> Any:
        argv = body.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise ApiError(400, 'body must be {"argv": ["decode", "--model-path", ...]}: the new role\'s '
                                "command line after `python -m epdctl.runtime`", "missing_field")
        if argv[0] not in ROLES:
            raise ApiError(400, f"cannot switch to {argv[0]!r}: a switchable worker is one of {', '.join(ROLES)}",
                           "invalid_role")
        try:
            new = self.parse(argv)
        except SystemExit:
            raise ApiError(400, f"the {argv[0]} command line does not parse; the worker's log says why",
                           "invalid_argv") from None
        old = self.args
        same_model = Path(new.model_path).expanduser().resolve() == Path(old.model_path).expanduser().resolve()
        if new.port != old.port or new.host != old.host or not same_model:
            raise ApiError(400, f"a switch keeps the process, its address and its model: got --host {new.host} "
                                f"--port {new.port} --model-path {new.model_path}, this worker is "
                                f"{old.host}:{old.port} with {old.model_path}; restart it instead",
                           "not_in_place")
        new.switchable = True
        return new

    async def h_switch(self, request: web.Request) -> web.Response:
        self.authorize(request)
        new = self._new_args(await read_json(request))
        async with self.lock:
            old = self.current
            old_role = old.role if old else ""
            if old is not None and old.role == new.role:
                return json_response({"success": True, "message": "already in target role",
                                      "old_role": old_role, "new_role": new.role, "seconds": 0.0})
            if old is not None and not old.idle():
                raise ApiError(409, f"the {old_role} still has work queued or in flight; drain it first "
                                    "(out of the router or encoder registries, /v1/loads at zero)", "not_idle")
            t0 = time.monotonic()
            old_args = self.args
            await self._teardown()
            try:
                await self.bring(new)
            except Exception as exc:
                log.exception("switch %s -> %s failed; restoring %s", old_role, new.role, old_role)
                self.m_switch.inc(labels={"outcome": "rolled_back"})
                await self._teardown()
                await self.bring(old_args)
                raise ApiError(500, f"switch to {new.role} failed ({type(exc).__name__}: {exc}); the worker "
                                    f"serves as {old_role} again", "switch_failed") from None
            seconds = time.monotonic() - t0
            self.m_switch.inc(labels={"outcome": "done"})
            self.m_seconds.observe(seconds)
            log.info("switched %s -> %s in place in %.3f s", old_role, new.role, seconds)
            return json_response({"success": True, "message": "ok", "old_role": old_role,
                                  "new_role": new.role, "seconds": seconds, "pid": os.getpid(),
                                  "port": new.port})

    async def bring(self, args: Any) -> None:
        """Build ``args.role`` around the loaded model and put it behind the dispatcher."""
        served = await self.build(args, self.bundle)
        prev = self.registries.get(args.role)
        metrics = getattr(served.server, "metrics", None)
        if prev is not None and isinstance(metrics, Registry):
            metrics.carry_over(prev)
        try:
            self.extra = await start_runners(served.extra)
            if served.on_ready is not None:
                await served.on_ready()
        except BaseException:
            await stop_runners(self.extra)
            self.extra = []
            await quietly(served.on_stop)
            raise
        if isinstance(metrics, Registry):
            self.registries[args.role] = metrics
        self.args, self.current = args, served

    async def _teardown(self) -> None:
        served, self.current = self.current, None
        if served is None:
            return
        await quietly(served.on_drain)
        await stop_runners(self.extra)
        self.extra = []
        await quietly(served.on_stop)


async def run_switchable(args: Any, parse: Parse) -> None:
    """Load the whole model once, then serve ``args.role`` until SIGTERM, switching on request."""
    from epdctl.runtime.model import load_bundle

    bundle = await asyncio.to_thread(load_bundle, args.model_path, role="colocated")
    # Freeze what loading made, not a role's servers: those are dropped at a switch, and a frozen
    # cycle is never collected.
    paths.active().serving()
    host = RoleHost(args, bundle, parse)
    stop = stop_event()
    # ready only once the first role's own ports are bound too (bring -> start_runners)
    main = await start_runners([(host.app(), args.host, args.port)], ready=False)
    try:
        await host.bring(args)
        await stop.wait()
        log.info("stopping (signal received): finishing in-flight requests")
    finally:
        served = host.current
        if served is not None:
            await quietly(served.on_drain)
        await stop_runners(main)
        await stop_runners(host.extra)
        if served is not None:
            await quietly(served.on_stop)
