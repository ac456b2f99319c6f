"""start_runners binds first, then writes the supervisor's ready byte, then serves (listen.py):
a busy port is a start failure with no byte; a worker whose /health answers has written it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
from typing import Callable, TypeVar

import aiohttp
import pytest
from aiohttp import web

from epdctl.runtime.errors import RuntimeWorkerError
from epdctl.runtime.servers.common import start_runners, stop_runners
from epdctl.runtime.servers.listen import READY_FD_ENV

T = TypeVar("T")


async def _health(_: web.Request) -> web.Response:
    return web.Response(text="OK")


def _app() -> web.Application:
    app = web.Application()
    app.router.add_get("/health", _health)
    return app


def _read(fd: int) -> bytes:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 16)
    except BlockingIOError:
        return b""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _retry_if_taken(attempt: Callable[[int, int], T]) -> T:
    """Run ``attempt(read_fd, write_fd)`` with a fresh ready pipe. Ports are picked free just
    before the bind, and another process (a parallel test's fixed port) can take one in between:
    that case, and only that one, picks again."""
    for _ in range(5):
        r, w = os.pipe()
        os.environ[READY_FD_ENV] = str(w)
        try:
            return attempt(r, w)
        except RuntimeWorkerError as e:
            if "another process" not in str(e):
                raise
            for fd in (r, w):
                with contextlib.suppress(OSError):
                    os.close(fd)
    raise AssertionError("five times a port picked free was taken before the bind")


def test_the_ready_byte_is_written_once_every_port_is_bound_and_before_health_answers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(READY_FD_ENV, "")

    def attempt(r: int, w: int) -> tuple[int, int, bytes, int]:
        ports = [_free_port(), _free_port()]

        async def run() -> tuple[bytes, int]:
            runners = await start_runners([(_app(), "127.0.0.1", p) for p in ports])
            try:
                got = _read(r)  # already there when start_runners returns, before any request
                async with aiohttp.ClientSession() as s:
                    async with s.get(f"http://127.0.0.1:{ports[1]}/health") as resp:
                        return got, resp.status
            finally:
                await stop_runners(runners)

        return (r, w, *asyncio.run(run()))

    r, w, got, status = _retry_if_taken(attempt)
    assert got == b"R" and status == 200
    assert READY_FD_ENV not in os.environ  # told once; children of the worker do not inherit it
    with pytest.raises(OSError):
        os.fstat(w)                          # and the write end is closed
    os.close(r)


def test_a_busy_port_fails_the_start_without_the_ready_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(READY_FD_ENV, "")

    def attempt(r: int, w: int) -> tuple[int, int, int]:
        free = _free_port()
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen(1)
            port = busy.getsockname()[1]
            try:
                asyncio.run(start_runners([(_app(), "127.0.0.1", free), (_app(), "127.0.0.1", port)]))
            except RuntimeWorkerError as e:
                if f"127.0.0.1:{free}" in str(e):
                    raise               # the free one was taken meanwhile: pick again
                assert re.search(f"cannot listen on 127.0.0.1:{port}.*another process", str(e)), e
                return r, w, free
        raise AssertionError(f"start_runners listened on {port}, which another socket holds")

    r, w, free = _retry_if_taken(attempt)
    assert _read(r) == b""          # not ready: the supervisor will not restart it, `up` reports it
    with socket.socket() as again:  # and the port bound before the failure was released
        again.bind(("127.0.0.1", free))
    os.close(r)
    os.close(w)
