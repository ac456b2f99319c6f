"""Prefill side of a hand-off: the KV (and, when the decode asked, the first token ahead of it)
to the decode of the same room, and a failed request's error in place of its KV.

A hand-off waits (bounded by ``--kv-timeout``) for the decode's route, then sends; the KV is
freed either way. The first token (the answer to the decode's route POST, bootstrap.py) is
written before the KV is copied, so the decode streams it while the KV is on its way (the KV's
copy and checksums would otherwise hold up the token's way through the decode and the router on
a shared host). A KV that then fails to leave is followed by an error message, so a decode that
is already streaming ends its answer at once instead of at its KV timeout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from epdctl.runtime.metrics import Counter, Histogram
from epdctl.runtime.openai_api import ApiError
from epdctl.runtime.servers.bootstrap import KVBootstrap
from epdctl.runtime.servers.common import Stopwatch

log = logging.getLogger(__name__)


class KVHandoff:
    def __init__(self, transport: Any, wire: Any, bootstrap: KVBootstrap, kv_timeout: float, bootstrap_port: int,
                 m_handoff: Counter, m_stage: Histogram):
        self.transport, self._wire, self.bootstrap = transport, wire, bootstrap
        self.kv_timeout, self.bootstrap_port = kv_timeout, bootstrap_port
        self.m_handoff, self.m_stage = m_handoff, m_stage
        self.tasks: set[asyncio.Task] = set()
        self.pending_tokens = 0   # prompt tokens of the KV caches held for their decode
        self.held = 0             # KV caches held for their decode

    def spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def handoff(self, room: str, result: Any, timings: dict[str, float]) -> None:
        """Wait (bounded) for the decode's route, then send it the KV; the KV is freed either way."""
        held = int(result.prompt_len)
        self.pending_tokens += held
        self.held += 1
        try:
            try:
                reply_to = (self.bootstrap.take_route(room)
                            or await self.bootstrap.wait_route(room, self.kv_timeout))
            except asyncio.TimeoutError:
                self.m_handoff.inc(labels={"outcome": "no_decode"})
                log.error("room %s: no decode asked for this KV within %g s (--kv-timeout); KV freed. Is the "
                          "decode reaching bootstrap port %d?", room, self.kv_timeout, self.bootstrap_port)
                return
            timings["t_route"] = time.time()
            if self.bootstrap.wants_first(room):
                # answered before the KV's copy and checksums take this core and the decode's loop:
                # the token's way to the client (decode, router) must not queue behind them
                meta = {"kind": "first", "token": int(result.first_token), "prompt_len": held,
                        "timings": dict(timings), "sent_at": time.time()}
                written = self.bootstrap.give_first(room, meta)
                if written is not None:
                    await asyncio.wait({written}, timeout=0.05)
            meta, tensors = self._wire.kv_to_tensors(result)
            del result
            meta["timings"] = timings
            meta["sent_at"] = time.time()
            watch = Stopwatch()
            try:
                await self.transport.send(reply_to, room, meta, tensors)
            except Exception as exc:
                self.m_handoff.inc(labels={"outcome": "failed"})
                log.error("room %s: sending the KV to %s failed: %s; KV freed", room, reply_to, exc)
                # the decode may be streaming already (its first token came ahead): end its wait now
                meta = {"kind": "error", "status": 502, "message": f"the KV hand-off failed: {exc}",
                        "code": "kv_handoff_failed", "type": "server_error"}
                self.spawn(self._send_to(reply_to, room, meta))
                return
            self.m_stage.observe(watch.ms() / 1000.0, {"stage": "kv_send"})
            self.m_handoff.inc(labels={"outcome": "sent"})
        finally:
            self.pending_tokens -= held
            self.held -= 1

    async def _send_to(self, reply_to: str, room: str, meta: dict[str, Any]) -> None:
        try:
            await self.transport.send(reply_to, room, meta, {})
        except Exception as exc:
            log.warning("room %s: could not tell the decode about the failure: %s", room, exc)

    def fail_partner(self, room: Any, err: ApiError) -> None:
        """Tell the decode of this room that no KV is coming, so it answers the same error now.

        Only the error's fields travel to the background task: the exception's traceback would keep
        the failed request's body (megabytes for a hostile one) alive for up to --kv-timeout.
        """
        if room is None or isinstance(room, bool) or not isinstance(room, (int, str)):
            return
        meta = {"kind": "error", "status": err.status, "message": err.message, "code": err.code, "type": err.type}
        self.spawn(self._send_error(str(room), meta))

    async def _send_error(self, room: str, meta: dict[str, Any]) -> None:
        try:
            reply_to = await self.bootstrap.wait_route(room, self.kv_timeout)
            if self.bootstrap.wants_first(room):  # no token will come: release the decode's wait for it
                self.bootstrap.give_first(room, None)
            await self.transport.send(reply_to, room, meta, {})
        except asyncio.TimeoutError:
            pass  # no decode for this room (a direct call, or the router never sent it)
        except Exception as exc:
            log.warning("room %s: could not tell the decode about the failure: %s", room, exc)

    async def stop(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
