"""The prefill's encoder registry (SGLang's EncoderBootstrapServer, same endpoints).

Encoders come from ``--encoder-urls`` or register at run time. Each is health-probed; three
failed probes in a row evict it (requests stop going there) and a later healthy probe
re-admits it. An encoder that answers a request meanwhile breaks the row: a busy encoder on
starved cores may miss a probe's deadline while it serves, and it is not gone. Work is placed
by rendezvous hashing on the image digest, so a repeated image lands on the encoder whose
embedding cache already holds it, unless that encoder is much busier than the least-loaded one.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from epdctl.runtime.errors import RuntimeWorkerError
from epdctl.runtime.openai_api import ApiError
from epdctl.runtime.servers.auth import require_bearer
from epdctl.runtime.servers.common import json_response, read_json

log = logging.getLogger(__name__)

EVICT_AFTER_FAILURES = 3
EVICTED_TTL_S = 600.0


@dataclass
class EncoderState:
    url: str
    healthy: bool = True
    failures: int = 0
    inflight: int = 0
    evicted_at: float | None = None
    served: int = 0
    static: bool = field(default=False)


class EncoderRegistry:
    """Known encoders, their health and load, and the placement rule."""

    def __init__(self, urls: list[str], *, probe_interval: float = 2.0, probe_timeout: float = 2.0,
                 load_slack: int = 2, api_key: str | None = None):
        self.api_key = api_key
        self.encoders: dict[str, EncoderState] = {}
        for url in urls:
            try:
                self.add(url, static=True)
            except ApiError as exc:
                raise RuntimeWorkerError(f"--encoder-urls: {exc.message}") from None
        self.probe_interval = probe_interval
        self.probe_timeout = probe_timeout
        self.load_slack = load_slack
        self._task: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None

    @staticmethod
    def normalize(url: str) -> str:
        """``http(s)://host[:port]`` (no path, query or credentials), or ApiError(400) saying why not."""
        url = url.strip().rstrip("/")
        if "://" not in url:
            url = "http://" + url
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise ApiError(400, f"encoder URL {url!r} is not a valid URL ({exc})", "invalid_url") from None
        if parts.scheme not in ("http", "https"):
            raise ApiError(400, f"encoder URL {url!r}: only http:// and https:// URLs can be registered",
                           "invalid_url")
        del port  # parsed only to reject a bad one
        if not parts.hostname or parts.username or parts.password or parts.path or parts.query \
                or parts.fragment or any(c.isspace() or ord(c) < 32 for c in url):
            raise ApiError(400, f"encoder URL {url!r}: expected http(s)://HOST[:PORT] with nothing after it",
                           "invalid_url")
        return url

    def add(self, url: str, static: bool = False) -> str:
        url = self.normalize(url)
        state = self.encoders.get(url)
        if state is None:  # a known encoder re-registering keeps its state: probes decide its health
            self.encoders[url] = EncoderState(url, static=static)
            log.info("encoder registered: %s", url)
        return url

    def remove(self, url: str) -> bool:
        removed = self.encoders.pop(self.normalize(url), None) is not None
        if removed:
            log.info("encoder unregistered: %s", self.normalize(url))
        return removed

    def healthy_urls(self) -> list[str]:
        return [s.url for s in self.encoders.values() if s.healthy]

    def pick(self, digest: str, exclude: AbstractSet[str] = frozenset(), extra: dict[str, int] | None = None) -> EncoderState:
        """Rendezvous-hash owner of ``digest`` unless it is overloaded; then the least loaded.

        ``extra`` adds load not yet counted (images of the same request already placed).
        """
        live = [s for s in self.encoders.values() if s.healthy and s.url not in exclude]
        if not live:
            raise ApiError(503, "no healthy encoder: register one with POST /register_encoder_url "
                                "or check the encoders given in --encoder-urls", "no_encoder")
        extra = extra or {}

        def load(s: EncoderState) -> int:
            return s.inflight + extra.get(s.url, 0)

        owner = max(live, key=lambda s: hashlib.sha256(f"{s.url}|{digest}".encode()).digest())
        least = min(live, key=load)
        return owner if load(owner) <= load(least) + self.load_slack else least

    async def pick_checked(self, digest: str, exclude: AbstractSet[str] = frozenset(),
                           extra: dict[str, int] | None = None) -> EncoderState:
        """``pick``, but before answering 503 no_encoder the encoders are probed once more, now:
        one that came back (or was registered healthy while its first probe was pending) since
        the last round of the probe loop is admitted and picked instead of failing the request."""
        try:
            return self.pick(digest, exclude, extra)
        except ApiError:
            if self._session is None or not self.encoders:
                raise
        await self.probe_all(self._session, only_unhealthy=True)
        return self.pick(digest, exclude, extra)

    def mark_failed(self, url: str) -> None:
        """A request to this encoder failed at the connection level: count it like a failed probe."""
        state = self.encoders.get(url)
        if state is not None:
            self._record(state, ok=False)

    def answered(self, url: str) -> None:
        """This encoder answered a request (embeddings, or a 4xx about the images): it is
        alive, so the probes it missed while busy do not count toward eviction."""
        state = self.encoders.get(url)
        if state is not None and state.healthy:
            state.failures = 0

    def _record(self, state: EncoderState, ok: bool) -> None:
        if ok:
            if not state.healthy:
                log.info("encoder %s is healthy again: re-admitted", state.url)
            state.healthy, state.failures, state.evicted_at = True, 0, None
            return
        state.failures += 1
        if state.healthy and state.failures >= EVICT_AFTER_FAILURES:
            state.healthy, state.evicted_at = False, time.monotonic()
            log.warning("encoder %s evicted after %d failed health checks", state.url, state.failures)

    async def probe_all(self, session: aiohttp.ClientSession, only_unhealthy: bool = False) -> None:
        """Probe every encoder (``only_unhealthy``: the evicted ones, whose failures no longer count)."""
        timeout = aiohttp.ClientTimeout(total=self.probe_timeout)

        async def probe(state: EncoderState) -> None:
            try:
                async with session.get(state.url + "/health", timeout=timeout) as resp:
                    ok = resp.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                ok = False
            self._record(state, ok)

        await asyncio.gather(*(probe(s) for s in list(self.encoders.values()) if not (only_unhealthy and s.healthy)))
        now = time.monotonic()
        for state in list(self.encoders.values()):
            if state.evicted_at is not None and not state.static and now - state.evicted_at > EVICTED_TTL_S:
                log.info("forgetting encoder %s (evicted for %.0f s)", state.url, EVICTED_TTL_S)
                self.encoders.pop(state.url, None)

    def start(self, session: aiohttp.ClientSession) -> None:
        self._session = session
        if self.probe_interval > 0:
            self._task = asyncio.create_task(self._loop(session))

    async def _loop(self, session: aiohttp.ClientSession) -> None:
        while True:
            await asyncio.sleep(self.probe_interval)
            try:
                await self.probe_all(session)
            except Exception:
                log.exception("encoder health probing failed")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def listing(self) -> dict:
        return {"encoder_urls": self.healthy_urls(),
                "encoders": [{"url": s.url, "healthy": s.healthy, "failures": s.failures,
                              "inflight": s.inflight, "served": s.served} for s in self.encoders.values()]}

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/register_encoder_url", self._h_register)
        app.router.add_delete("/unregister_encoder_url", self._h_unregister)
        app.router.add_get("/list_encoder_urls", self._h_list)

    def authorize(self, request: web.Request) -> None:
        """With an API key set, the registry answers only ``Authorization: Bearer <key>``."""
        require_bearer(request, self.api_key, "the encoder registry")

    async def _h_register(self, request: web.Request) -> web.Response:
        self.authorize(request)
        url = self.normalize(_url_field(await read_json(request)))
        if url not in self.encoders and not await self._answers(url):
            raise ApiError(400, f"encoder {url} does not answer GET /health; start it first (a registration "
                                "is admitted only once the encoder is reachable)", "encoder_unreachable")
        return json_response({"status": "ok", "url": self.add(url)})

    async def _answers(self, url: str) -> bool:
        """A new registration is probed once, so a bogus URL never receives requests."""
        if self._session is None:
            return True  # not serving yet (unit use): the probe loop decides
        try:
            async with self._session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=self.probe_timeout),
                                         allow_redirects=False) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False

    async def _h_unregister(self, request: web.Request) -> web.Response:
        self.authorize(request)
        url = _url_field(await read_json(request))
        if not self.remove(url):
            raise ApiError(404, f"encoder {url} is not registered", "not_registered")
        return json_response({"status": "ok", "url": self.normalize(url)})

    async def _h_list(self, request: web.Request) -> web.Response:
        self.authorize(request)
        return json_response(self.listing())


def _url_field(body: dict) -> str:
    url = body.get("url")
    if not isinstance(url, str) or not url.strip():
        raise ApiError(400, "body must be {\"url\": \"http://host:port\"}", "missing_field")
    return url


def api_key_from_env(name: str | None) -> str | None:
    """The key held by environment variable ``name`` (the key itself never appears on a command line)."""
    return (os.environ.get(name) or None) if name else None


def bearer(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def bootstrap_app(registry: EncoderRegistry, app: web.Application) -> web.Application:
    """The mirror served on ``--encoder-bootstrap-port`` (as SGLang's EncoderBootstrapServer)."""
    registry.add_routes(app)

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="OK")

    app.router.add_get("/health", health)
    return app
