"""KV bootstrap: how a prefill finds the decode that serves the same ``bootstrap_room``.

The router sends the same body to both at once; either may arrive first. The decode POSTs
``/kv/route {"room", "reply_to"}`` to the prefill's ``--bootstrap-port``; the prefill waits
(bounded) for that route before sending the KV. Routes nobody claims expire, so rooms that
lost their partner cannot pile up.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
from aiohttp import web

from epdctl.runtime.openai_api import ApiError
from epdctl.runtime.servers.common import json_response, make_app, read_json

log = logging.getLogger(__name__)


class KVBootstrap:
    """room → decode transport address, with waiting on either side."""

    def __init__(self, route_ttl: float = 120.0):
        self._routes: dict[str, tuple[asyncio.Future, float]] = {}
        self.route_ttl = route_ttl
        self._sweeper: asyncio.Task | None = None

    def _entry(self, room: str) -> asyncio.Future:
        entry = self._routes.get(room)
        if entry is None:
            entry = (asyncio.get_running_loop().create_future(), time.monotonic())
            self._routes[room] = entry
        return entry[0]

    def set_route(self, room: str, reply_to: str) -> None:
        fut = self._entry(room)
        if not fut.done():
            fut.set_result(reply_to)

    async def wait_route(self, room: str, timeout: float) -> str:
        """The decode address for ``room``; raises asyncio.TimeoutError. Consumes the route."""
        fut = self._entry(room)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        finally:
            self._routes.pop(room, None)

    def __len__(self) -> int:
        return len(self._routes)

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep())

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(max(1.0, self.route_ttl / 4))
            now = time.monotonic()
            for room, (fut, born) in list(self._routes.items()):
                if now - born > self.route_ttl:
                    self._routes.pop(room, None)
                    if not fut.done():
                        fut.cancel()

    def app(self) -> web.Application:
        app = make_app(64 * 1024)  # route registrations are a few hundred bytes
        app.router.add_post("/kv/route", self._h_route)
        app.router.add_get("/health", self._h_health)
        return app

    async def _h_route(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        room, reply_to = body.get("room"), body.get("reply_to")
        if not isinstance(room, (int, str)) or isinstance(room, bool) or not isinstance(reply_to, str):
            raise ApiError(400, 'body must be {"room": <int>, "reply_to": "<transport address>"}', "missing_field")
        self.set_route(str(room), reply_to)
        return json_response({"status": "ok"})

    async def _h_health(self, _: web.Request) -> web.Response:
        return web.Response(text="OK")


async def register_route(session: aiohttp.ClientSession, host: str, port: int, room: int, reply_to: str,
                         timeout: float = 10.0) -> None:
    """Decode side: tell the prefill's bootstrap server where to send this room's KV."""
    url = f"http://{host}:{port}/kv/route"
    try:
        async with session.post(url, json={"room": room, "reply_to": reply_to},
                                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            if resp.status != 200:
                raise ApiError(502, f"prefill bootstrap server {url} answered HTTP {resp.status}: "
                                    f"{(await resp.text())[:200]}", "bootstrap_failed")
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise ApiError(502, f"cannot reach the prefill bootstrap server {url}: {exc or type(exc).__name__} "
                            "(check bootstrap_host/bootstrap_port and that the prefill is running)",
                       "bootstrap_failed") from None
