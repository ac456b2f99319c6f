"""KV bootstrap: how a prefill finds the decode that serves the same ``bootstrap_room``.

The router sends the same body to both at once; either may arrive first. The decode POSTs
``/kv/route {"room", "reply_to"}`` to the prefill's ``--bootstrap-port``; the prefill waits
(bounded) for that route before sending the KV. A decode that adds ``"first_token": true`` gets
the prefill's first token ahead of the KV as the ANSWER to that POST, held until the prefill has
it (``give_first``), so it can stream the token while the KV is still on its way: an answer on a
connection the decode already waits on costs one wake-up, a transport message three. An answer without ``first`` means no token comes that way (a prefill that failed,
or one that predates the field): the KV, or the error, follows on the transport as always. Routes nobody claims expire, so rooms that
lost their partner cannot pile up.

A decode does not wait out ``--kv-timeout`` for a prefill that died: while it waits it asks
``GET /kv/room/{room}`` every second; a prefill that does not know the room (it restarted and lost
it) or does not answer the connection (it is gone) ends the wait at once with a 503
``prefill_lost``, which the router may retry on the restarted prefill. With the cluster's API key
both routes answer only ``Authorization: Bearer KEY`` (auth.py).
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
from aiohttp import web

from epdctl.runtime.openai_api import ApiError
from epdctl.runtime.servers.auth import require_bearer
from epdctl.runtime.servers.common import json_response, make_app, read_json

log = logging.getLogger(__name__)
WATCH_EVERY_S = 1.0   # how often a waiting decode asks the prefill whether it still has the room


class KVBootstrap:
    """room → decode transport address, with waiting on either side."""

    def __init__(self, route_ttl: float = 120.0, api_key: str | None = None):
        self._routes: dict[str, tuple[asyncio.Future, float]] = {}
        self._taken: dict[str, float] = {}   # rooms whose route the prefill took (KV on its way)
        self._early: set[str] = set()        # rooms whose decode wants the first token ahead of the KV
        self._firsts: dict[str, tuple[asyncio.Future, asyncio.Future]] = {}  # room -> (token, answer written)
        self.route_ttl = route_ttl
        self.api_key = api_key
        self._sweeper: asyncio.Task | None = None

    def _entry(self, room: str) -> asyncio.Future:
        entry = self._routes.get(room)
        if entry is None:
            entry = (asyncio.get_running_loop().create_future(), time.monotonic())
            self._routes[room] = entry
        return entry[0]

    def set_route(self, room: str, reply_to: str, first_token: bool = False) -> None:
        if first_token:
            self._early.add(room)
        fut = self._entry(room)
        if not fut.done():
            fut.set_result(reply_to)

    async def wait_route(self, room: str, timeout: float) -> str:
        """The decode address for ``room``; raises asyncio.TimeoutError. Consumes the route."""
        fut = self._entry(room)
        try:
            reply_to = await asyncio.wait_for(asyncio.shield(fut), timeout)
            self._taken[room] = time.monotonic()
            return reply_to
        finally:
            self._routes.pop(room, None)

    def take_route(self, room: str) -> str | None:
        """The decode address for ``room`` if it is already known (consumed), else None: the
        prefill's fast path, without a round through the event loop."""
        entry = self._routes.get(room)
        if entry is None or not entry[0].done() or entry[0].cancelled():
            return None
        self._routes.pop(room, None)
        self._taken[room] = time.monotonic()
        return str(entry[0].result())

    def wants_first(self, room: str) -> bool:
        """Whether the room's decode asked for the first token ahead of the KV (asked once)."""
        if room in self._early:
            self._early.discard(room)
            return True
        return False

    def give_first(self, room: str, meta: dict | None) -> asyncio.Future | None:
        """Answer the room's waiting route POST with its first token's message (None: no token will
        come). A future done once the answer is written, or None when no decode waits for it."""
        pair = self._firsts.get(room)
        if pair is None or pair[0].done():
            return None
        pair[0].set_result(meta)
        return pair[1]

    def knows(self, room: str) -> bool:
        """True while the room is waiting for its route or its KV is being sent."""
        return room in self._routes or room in self._taken

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
                    self._early.discard(room)
                    if not fut.done():
                        fut.cancel()
            for room, born in list(self._taken.items()):
                if now - born > self.route_ttl:
                    self._taken.pop(room, None)
            self._early &= set(self._routes) | set(self._taken)

    def app(self) -> web.Application:
        app = make_app(64 * 1024)  # route registrations are a few hundred bytes
        app.router.add_post("/kv/route", self._h_route)
        app.router.add_get("/kv/room/{room}", self._h_room)
        app.router.add_get("/health", self._h_health)
        return app

    async def _h_route(self, request: web.Request) -> web.Response:
        require_bearer(request, self.api_key, "the KV bootstrap")
        body = await read_json(request)
        room, reply_to = body.get("room"), body.get("reply_to")
        if not isinstance(room, (int, str)) or isinstance(room, bool) or not isinstance(reply_to, str):
            raise ApiError(400, 'body must be {"room": <int>, "reply_to": "<transport address>"}', "missing_field")
        room, first = str(room), body.get("first_token") is True
        self.set_route(room, reply_to, first_token=first)
        if not first:
            return json_response({"status": "ok"})
        loop = asyncio.get_running_loop()
        pair = (loop.create_future(), loop.create_future())
        self._firsts[room] = pair
        try:
            try:
                meta = await asyncio.wait_for(asyncio.shield(pair[0]), self.route_ttl)
            except asyncio.TimeoutError:
                meta = None
            resp = json_response({"status": "ok", "first": meta} if meta else {"status": "ok"})
            await resp.prepare(request)
            await resp.write_eof()
            return resp
        finally:
            if self._firsts.get(room) is pair:
                del self._firsts[room]
            if not pair[1].done():
                pair[1].set_result(None)

    async def _h_room(self, request: web.Request) -> web.Response:
        require_bearer(request, self.api_key, "the KV bootstrap")
        room = request.match_info["room"]
        if not self.knows(room):
            raise ApiError(404, f"bootstrap_room {room} is unknown here (never seen, expired, or this "
                                "prefill restarted)", "room_not_found")
        return json_response({"room": room, "state": "waiting" if room in self._routes else "sending"})

    async def _h_health(self, _: web.Request) -> web.Response:
        return web.Response(text="OK")


def _unreachable(url: str, exc: BaseException) -> ApiError:
    return ApiError(502, f"cannot reach the prefill bootstrap server {url}: {exc or type(exc).__name__} "
                         "(check bootstrap_host/bootstrap_port and that the prefill is running)", "bootstrap_failed")


async def _refused(url: str, resp: aiohttp.ClientResponse) -> ApiError:
    return ApiError(502, f"prefill bootstrap server {url} answered HTTP {resp.status}: {(await resp.text())[:200]}",
                    "bootstrap_failed")


async def register_route(session: aiohttp.ClientSession, host: str, port: int, room: int, reply_to: str,
                         timeout: float = 10.0, headers: dict[str, str] | None = None) -> None:
    """Decode side: tell the prefill's bootstrap server where to send this room's KV."""
    url = f"http://{host}:{port}/kv/route"
    try:
        async with session.post(url, json={"room": room, "reply_to": reply_to}, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            if resp.status != 200:
                raise await _refused(url, resp)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise _unreachable(url, exc) from None


async def route_for_first(session: aiohttp.ClientSession, host: str, port: int, room: int, reply_to: str,
                          timeout: float, headers: dict[str, str] | None = None) -> dict | None:
    """Decode side: register the route asking for the first token ahead of the KV; answered when
    the prefill has it. The token's message, or None: no token comes this way (the KV or an error
    follows on the transport), or the connection broke after it was made (the KV wait's watch then
    tells a lost prefill from a slow one). ApiError 502 when the bootstrap server cannot be reached."""
    url = f"http://{host}:{port}/kv/route"
    try:
        async with session.post(url, json={"room": room, "reply_to": reply_to, "first_token": True}, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            if resp.status != 200:
                raise await _refused(url, resp)
            body = await resp.json()
    except (aiohttp.ClientConnectorError, ConnectionRefusedError) as exc:
        raise _unreachable(url, exc) from None
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
        return None
    first = body.get("first") if isinstance(body, dict) else None
    return first if isinstance(first, dict) and first.get("kind") == "first" else None


async def room_lost(session: aiohttp.ClientSession, host: str, port: int, room: int,
                    headers: dict[str, str] | None = None) -> str | None:
    """Decode side: why the prefill can no longer send ``room`` (None: it still can, or cannot tell)."""
    url = f"http://{host}:{port}/kv/room/{room}"
    try:
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=2.0)) as resp:
            return "it does not know the room (restarted?)" if resp.status == 404 else None
    except aiohttp.ClientConnectorError as exc:
        return f"its bootstrap server refuses connections ({exc.os_error.strerror or exc})"
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return None  # busy or slow is not gone: keep waiting (--kv-timeout still bounds it)


async def await_kv(recv: "asyncio.Task[tuple[dict, dict]]", session: aiohttp.ClientSession, host: str, port: int,
                   room: int, headers: dict[str, str] | None = None, *, kv_timeout: float,
                   every: float = WATCH_EVERY_S) -> tuple[dict, dict]:
    """The room's KV from ``recv`` (which times out after ``kv_timeout``: ApiError 504
    ``kv_timeout``), or ApiError 503 ``prefill_lost`` as soon as the prefill that owes it is gone."""
    while True:
        done, _ = await asyncio.wait({recv}, timeout=every)
        if done:
            try:
                return recv.result()
            except asyncio.TimeoutError:
                raise ApiError(504, f"no KV cache arrived for bootstrap_room {room} from the prefill at "
                                    f"{host}:{port} within {kv_timeout:g} s (--kv-timeout); did the prefill "
                                    "get the same request?", "kv_timeout") from None
        why = await room_lost(session, host, port, room, headers)
        if why is not None and not recv.done():
            raise ApiError(503, f"the prefill at {host}:{port} can no longer send the KV of bootstrap_room "
                                f"{room}: {why}; retry the request", "prefill_lost")
