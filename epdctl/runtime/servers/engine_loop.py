"""The one thread that owns a ``DecodeEngine`` (and, colocated, every other model call).

The engine is not thread-safe, so ``add``/``abort`` and any other model work (a colocated
prefill or encode) are queued as commands and run by this thread between decode steps. Each
step's tokens are handed back to the event loop, one asyncio queue per sequence.

On a worker pinned to one core (``cpus:``, the EPD decode's own core) the engine thread and the
event loop cannot overlap, and the engine steps back to back, so each step's tokens waited for
the scheduler to preempt the next step (a token reached its client a step or more late:
benchmarks/burst_gaps.py). There, after a step the thread waits (at most ``FLUSH_WAIT_S``) until
the loop has run the handlers those tokens woke (their SSE writes), and the GIL hands over after
``SWITCH_INTERVAL_S`` instead of Python's default, so the loop's short callbacks do not queue behind a step.
The handlers' work runs on that core either way; run first it costs the step nothing. With more
cores the two overlap, and nothing changes (waiting there slowed a one-stream decode).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sys
import threading
import time
from typing import Any, Callable

from epdctl.runtime.servers.busy import BusyClock

log = logging.getLogger(__name__)

FLUSH_WAIT_S = 0.002  # one core: the longest a step waits for the previous step's tokens to be written
SWITCH_INTERVAL_S = 0.0002  # one core: the GIL's hand-over interval (shorter than Python's default)


class EngineLoop:
    def __init__(self, engine: Any, loop: asyncio.AbstractEventLoop, name: str = "decode-loop"):
        self.engine = engine
        self.loop = loop
        self._cmds: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.Future | None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._flushed = threading.Event()  # set by the event loop once a step's tokens went out
        self.one_core = len(os.sched_getaffinity(0)) == 1  # engine and event loop share one core
        self._streams: dict[str, asyncio.Queue] = {}
        self._in_engine: set[str] = set()  # touched only by the engine thread
        self._stopping = False
        self.pending_commands = 0
        self.steps = 0
        self.busy = BusyClock()  # seconds spent in steps and model commands (the decode's own work)
        self.trace: Any = None  # a loop_trace.LoopTrace: every step and command timed
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        if self.one_core:
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=10)

    @property
    def num_running(self) -> int:
        return len(self._streams)

    def call(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future:
        """Run ``fn(*args)`` on the engine thread; await the returned future for its result."""
        fut = self.loop.create_future()
        self.pending_commands += 1
        self._cmds.put((lambda: fn(*args), fut))
        self._wake.set()
        return fut

    async def add(self, seq_id: str, result: Any, params: Any) -> asyncio.Queue:
        """Start decoding; tokens arrive on the returned queue as (token, finished), or an exception."""
        q: asyncio.Queue = asyncio.Queue()
        self._streams[seq_id] = q
        try:
            await self.call(self._engine_add, seq_id, result, params)
        except BaseException:
            self._streams.pop(seq_id, None)
            self._cmds.put((lambda: self._engine_abort(seq_id), None))
            self._wake.set()
            raise
        return q

    def _engine_add(self, seq_id: str, result: Any, params: Any) -> None:
        self.engine.add(seq_id, result, params)
        self._in_engine.add(seq_id)

    def _engine_abort(self, seq_id: str) -> None:
        self.engine.abort(seq_id)
        self._in_engine.discard(seq_id)

    def abort(self, seq_id: str) -> None:
        """Stop a sequence now and free its KV (safe to call for finished or unknown ids)."""
        if self._streams.pop(seq_id, None) is not None:
            self._cmds.put((lambda: self._engine_abort(seq_id), None))
            self._wake.set()

    def _run(self) -> None:
        while not self._stopping:
            self._drain()
            if self.engine.num_running == 0:
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            try:
                t0, c0 = time.perf_counter(), time.thread_time()
                with self.busy:
                    out = self.engine.step()
                if self.trace is not None:
                    self.trace.step(t0, time.perf_counter(), len(out), time.thread_time() - c0)
            except Exception as exc:  # a broken step must not wedge every running request
                log.exception("decode step failed; aborting the running sequences")
                self.loop.call_soon_threadsafe(self._fail_all, exc)
                for sid in list(self._in_engine):
                    self._engine_abort(sid)
                continue
            self.steps += 1
            for seq_id, _, done in out:
                if done:
                    self._in_engine.discard(seq_id)
            if out:
                self._flushed.clear()
                self.loop.call_soon_threadsafe(self._deliver, out, time.perf_counter())
                if self.one_core:
                    self._flushed.wait(FLUSH_WAIT_S)

    def _drain(self) -> None:
        while True:
            try:
                fn, fut = self._cmds.get_nowait()
            except queue.Empty:
                return
            t0 = time.perf_counter()
            try:
                with self.busy:
                    res, err = fn(), None
            except BaseException as exc:  # handed to the awaiting coroutine
                res, err = None, exc
            if self.trace is not None:
                self.trace.command(t0, time.perf_counter())
            if fut is not None:
                self.loop.call_soon_threadsafe(self._settle, fut, res, err)

    def _settle(self, fut: asyncio.Future, res: Any, err: BaseException | None) -> None:
        self.pending_commands -= 1
        if fut.done():
            return
        if err is not None:
            fut.set_exception(err)
        else:
            fut.set_result(res)

    def _deliver(self, out: list[tuple[str, int, bool]], t_step_end: float = 0.0) -> None:
        if self.trace is not None:
            self.trace.deliver(t_step_end)
        for seq_id, token, done in out:
            q = self._streams.get(seq_id)
            if q is None:
                continue
            q.put_nowait((token, done))
            if done:
                self._streams.pop(seq_id, None)
        # runs after the handlers these tokens woke (call_soon keeps order): they have written
        self.loop.call_soon(self._flushed.set)

    def _fail_all(self, exc: BaseException) -> None:
        for q in self._streams.values():
            q.put_nowait(exc)
        self._streams.clear()
