"""A worker's timeline, for finding where a decode's token gaps come from (off unless asked).

Set ``EPDCTL_LOOP_TRACE=<file>`` in a worker's environment (a topology's ``env:``) and it records,
on the shared monotonic clock (``time.perf_counter``, the same in every process of the host, so
a client's token stamps line up with it):
- every event-loop callback that runs ``SLOW_S`` or longer, labelled with the task's coroutine
  and where it suspended, with the thread's CPU time in it (the rest: waiting for the GIL or
  a core);
- every engine step (start, end, rows, the thread's CPU time) and every engine command between steps (start, end);
- every garbage collection (start, end, generation);
- each step's tokens reaching their queues on the event loop, and each token taken from its
  queue to be sent (per sequence): the decode's own view of its token gaps.
It is written as JSON to the file when the worker stops (``dump``). Off, nothing is patched
and the engine loop pays one ``is None`` test per step.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ENV = "EPDCTL_LOOP_TRACE"
SLOW_S = 0.0005
MAX_EVENTS = 400_000


def _where(coro: Any) -> str:
    """The innermost frame a coroutine is suspended in (``func:line``), following its awaits."""
    label = ""
    depth = 0
    while coro is not None and depth < 12:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        label = f"{frame.f_code.co_name}:{frame.f_lineno}"
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        depth += 1
    return label


def _label(handle: asyncio.Handle) -> tuple[str, Any]:
    cb = getattr(handle, "_callback", None)
    task = getattr(cb, "__self__", None)
    if isinstance(task, asyncio.Task):
        coro = task.get_coro()
        return getattr(coro, "__qualname__", "task"), coro
    return getattr(cb, "__qualname__", None) or repr(cb)[:80], None


class LoopTrace:
    def __init__(self, path: str):
        self.path = path
        self.loop_events: list[tuple[float, float, float, str]] = []  # (start, end, thread CPU s, label)
        self.steps: list[tuple[float, float, int, float]] = []        # (start, end, rows, thread CPU s)
        self.commands: list[tuple[float, float]] = []
        self.delivered: list[tuple[float, float]] = []                # (step end, tokens on their queues)
        self.written: dict[str, list[float]] = {}                     # seq_id -> each token taken to be sent
        self.gcs: list[tuple[float, float, int]] = []
        self._gc_t0 = 0.0
        self._orig_run: Any = None

    def install(self) -> None:
        """Time the event loop's callbacks (all loops of this process) and the collector."""
        orig = self._orig_run = asyncio.events.Handle._run
        events = self.loop_events

        def _run(handle: asyncio.Handle) -> None:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                orig(handle)
            finally:
                t1 = time.perf_counter()
                if t1 - t0 >= SLOW_S and len(events) < MAX_EVENTS:
                    name, coro = _label(handle)
                    events.append((t0, t1, time.thread_time() - c0,
                                   f"{name} -> {_where(coro)}" if coro is not None else name))

        asyncio.events.Handle._run = _run  # type: ignore[method-assign,assignment]
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        elif len(self.gcs) < MAX_EVENTS:
            self.gcs.append((self._gc_t0, time.perf_counter(), int(info.get("generation", -1))))

    def step(self, t0: float, t1: float, rows: int, cpu: float) -> None:
        if len(self.steps) < MAX_EVENTS:
            self.steps.append((t0, t1, rows, cpu))

    def command(self, t0: float, t1: float) -> None:
        if len(self.commands) < MAX_EVENTS:
            self.commands.append((t0, t1))

    def deliver(self, t_step_end: float) -> None:
        if len(self.delivered) < MAX_EVENTS:
            self.delivered.append((t_step_end, time.perf_counter()))

    def token(self, seq_id: str) -> None:
        stamps = self.written.setdefault(seq_id, [])
        if len(stamps) < 4096 and len(self.written) < 20_000:
            stamps.append(time.perf_counter())

    def dump(self) -> None:
        """Write the trace; a path that cannot be written is logged, never a failed shutdown."""
        try:
            Path(self.path).write_text(json.dumps({
                "pid": os.getpid(), "slow_s": SLOW_S, "loop": self.loop_events, "steps": self.steps,
                "commands": self.commands, "gc": self.gcs, "delivered": self.delivered, "written": self.written}))
        except OSError as exc:
            log.error("%s=%s: cannot write the loop trace (%s)", ENV, self.path, exc)


_TRACE: LoopTrace | None = None


def from_env() -> LoopTrace | None:
    """The process's trace when ``EPDCTL_LOOP_TRACE`` names a file (installed once), else None."""
    global _TRACE
    path = os.environ.get(ENV)
    if not path:
        return None
    if _TRACE is None:
        _TRACE = LoopTrace(path)
        _TRACE.install()
    return _TRACE
