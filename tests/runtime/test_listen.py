"""start_runners binds first, then writes the supervisor's ready byte, then serves (listen.py):
a busy port is a start failure with no byte; a worker whose /health answers has written it."""

from __future__ import annotations

import asyncio
import os
import socket

import aiohttp
import pytest
from aiohttp import web

from epdctl.runtime.errors import RuntimeWorkerError
from epdctl.runtime.servers.common import start_runners, stop_runners
from epdctl.runtime.servers.listen import READY_FD_ENV


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


def test_the_ready_byte_is_written_once_every_port_is_bound_and_before_health_answers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    r, w = os.pipe()
    monkeypatch.setenv(READY_FD_ENV, str(w))
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

    got, status = asyncio.run(run())
    assert got == b"R" and status == 200
    assert READY_FD_ENV not in os.environ  # told once; children of the worker do not inherit it
    with pytest.raises(OSError):
        os.fstat(w)                          # and the write end is closed
    os.close(r)


def test_a_busy_port_fails_the_start_without_the_ready_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    r, w = os.pipe()
    monkeypatch.setenv(READY_FD_ENV, str(w))
    free = _free_port()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(RuntimeWorkerError, match=f"cannot listen on 127.0.0.1:{port}.*another process"):
            asyncio.run(start_runners([(_app(), "127.0.0.1", free), (_app(), "127.0.0.1", port)]))
    assert _read(r) == b""          # not ready: the supervisor will not restart it, `up` reports it
    with socket.socket() as again:  # and the port bound before the failure was released
        again.bind(("127.0.0.1", free))
    os.close(r)
    os.close(w)
