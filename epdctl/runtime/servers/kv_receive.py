"""Decode side of a hand-off: claim a room's KV from its prefill, or its first token ahead of it.

The decode registers its transport address with the prefill's KV bootstrap and waits (bounded by
``--kv-timeout``, and cut short when the prefill is gone) for the KV. With ``early`` it also asks
for the prefill's first token ahead of the KV (the answer to its route POST, bootstrap.py):
whichever arrives first is the answer, and when it is the token, the KV keeps arriving in
``Received.kv`` while the decode streams that token. A KV that arrives after its client left is
still received and dropped at once, so it never lingers in memory.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from epdctl.runtime.metrics import Counter
from epdctl.runtime.openai_api import ApiError
from epdctl.runtime.servers.bootstrap import await_kv, register_route, route_for_first
from epdctl.runtime.servers.common import to_api_error


@dataclass
class Received:
    meta: dict                         # the KV's meta, or the token message's (kind "first")
    tensors: dict
    wait_ms: float                     # registration to arrival
    kv: asyncio.Task | None = None     # early token: the KV, still on its way


class KVReceiver:
    def __init__(self, transport: Any, kv_timeout: float, auth: dict[str, str] | None, outcomes: Counter):
        self.transport = transport
        self.kv_timeout = kv_timeout
        self.auth = auth
        self.outcomes = outcomes        # kv_receive_total by outcome
        self.session: aiohttp.ClientSession | None = None
        self.waiting = 0                # requests waiting for a KV
        self.late: set[asyncio.Task] = set()

    async def receive(self, req: Any, early: bool = False) -> Received:
        """The room's KV, or with ``early`` possibly its first token (``meta["kind"] == "first"``,
        the KV pending in ``kv``). ApiError for a KV that times out, a prefill that is gone, or the
        error the prefill sent instead of the KV."""
        assert self.session is not None, "KVReceiver.session is set when the worker is ready"
        room = str(req.bootstrap_room)
        t0 = time.perf_counter()
        kv = asyncio.create_task(self.transport.recv(room, self.kv_timeout))
        kv.add_done_callback(_retrieved)  # a KV nobody waits for any more (its client left) ends quietly
        first: asyncio.Task | None = None
        got: Received | None = None
        drained = False
        self.waiting += 1
        try:
            where = (self.session, req.bootstrap_host, req.bootstrap_port, req.bootstrap_room, self.transport.address)
            if early:
                first = asyncio.create_task(route_for_first(*where, timeout=self.kv_timeout, headers=self.auth))
                either = asyncio.create_task(_first_of(first, kv))
            else:
                await register_route(*where, timeout=min(10.0, self.kv_timeout), headers=self.auth)
                either = kv
            try:
                meta, tensors = await self._await(req, either)
            finally:
                if either is not kv and not either.done():
                    either.cancel()
            wait_ms = (time.perf_counter() - t0) * 1000.0
            got = Received(meta, tensors, wait_ms, kv if meta.get("kind") == "first" else None)
        except asyncio.CancelledError:
            self.drain(room, kv)
            drained = True
            raise
        finally:
            self.waiting -= 1
            if first is not None and not first.done():  # the KV came first: its route POST is not needed
                first.cancel()
            elif first is not None and not first.cancelled():
                first.exception()  # retrieved: its error (if any) was raised through _first_of
            if got is None and not drained:
                if not kv.done():
                    kv.cancel()
                self.transport.discard(room)
        if got.kv is None:
            self._raise_if_error(got.meta)
            self.outcomes.inc(labels={"outcome": "ok"})
        return got

    async def rest(self, req: Any, kv: asyncio.Task) -> tuple[dict, dict, float]:
        """The KV of a room whose first token came ahead of it: (meta, tensors, wait ms). Every
        failure is an ApiError (the answer is already streaming: it ends with that error)."""
        t0 = time.perf_counter()
        self.waiting += 1
        try:
            meta, tensors = await self._await(req, kv)
        except ApiError:
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a damaged KV: TransferError and the like
            self.outcomes.inc(labels={"outcome": "error"})
            raise to_api_error(exc) from None
        finally:
            self.waiting -= 1
        self._raise_if_error(meta)
        self.outcomes.inc(labels={"outcome": "ok"})
        return meta, tensors, (time.perf_counter() - t0) * 1000.0

    async def _await(self, req: Any, task: asyncio.Task) -> tuple[dict, dict]:
        assert self.session is not None
        try:
            return await await_kv(task, self.session, req.bootstrap_host, req.bootstrap_port, req.bootstrap_room,
                                  self.auth, kv_timeout=self.kv_timeout)
        except ApiError as err:
            self.outcomes.inc(labels={"outcome": "timeout" if err.code == "kv_timeout" else "lost"})
            raise

    def _raise_if_error(self, meta: dict) -> None:
        if meta.get("kind") == "error":
            self.outcomes.inc(labels={"outcome": "error"})
            raise ApiError(int(meta.get("status", 500)), f"prefill: {meta.get('message')}", meta.get("code"),
                           meta.get("type"))

    def drain(self, key: str, task: asyncio.Task | None = None, timeout: float | None = None) -> None:
        """Nobody will use what arrives under ``key``: take it when it comes (within ``timeout``,
        default --kv-timeout) and drop it. ``task`` is a recv of that key already running."""
        if task is not None and task.done():
            if not task.cancelled():
                task.exception()  # retrieved: nobody will ask
            self.transport.discard(key)
            return
        wait = self.kv_timeout if timeout is None else timeout

        async def drain() -> None:
            try:
                if task is not None:
                    await asyncio.wait_for(asyncio.shield(task), wait)
                else:
                    await self.transport.recv(key, wait)
                self.outcomes.inc(labels={"outcome": "late"})
            except BaseException:
                pass
            finally:
                if task is not None and not task.done():
                    task.cancel()
                self.transport.discard(key)

        late = asyncio.get_running_loop().create_task(drain())
        self.late.add(late)
        late.add_done_callback(self.late.discard)


def prefill_timings(meta: dict) -> dict[str, float]:
    """The prefill's figures and every worker's wall-clock stamps (``t_*``) that a KV or a
    first-token message carries: one request's path end to end."""
    pt = meta.get("timings", {})
    out = {"encode_ms": pt.get("encode_ms", 0.0), "prefill_ms": pt.get("prefill_ms", 0.0),
           "embedding_bytes": pt.get("embedding_bytes", 0.0)}
    out.update({k: float(v) for k, v in pt.items() if k.startswith("t_") and isinstance(v, (int, float))})
    return out


def kv_arrival(meta: dict, kv_wait_ms: float) -> dict[str, float]:
    """The decode's own figures for a KV that just arrived."""
    now = time.time()
    sent_at = float(meta.get("sent_at", now))
    return {"kv_transfer_ms": max(0.0, (now - sent_at) * 1000.0), "kv_wait_ms": kv_wait_ms, "t_kv_in": now}


async def _first_of(first: asyncio.Task, kv: asyncio.Task) -> tuple[dict, dict]:
    """The first token once it is here, even when the KV is too (a busy decode loop may see both
    at once: streaming the token now still beats an engine step that only re-emits it); when no
    token comes (its answer carried none), the KV. A bootstrap server that cannot be reached
    raises here."""
    await asyncio.wait({first, kv}, return_when=asyncio.FIRST_COMPLETED)
    if first.done() and not first.cancelled() and first.exception() is None and first.result() is not None:
        return first.result(), {}
    if kv.done():
        return kv.result()
    first.result()  # raises when the bootstrap server could not be reached; else it carried no token
    return await asyncio.shield(kv)


def _retrieved(task: asyncio.Task) -> None:
    """Mark a finished KV task's error as seen: whoever awaits it still gets the error; one left
    behind by a request that ended first (a timeout after the client went away) is not logged as
    'Task exception was never retrieved'."""
    if not task.cancelled():
        task.exception()
