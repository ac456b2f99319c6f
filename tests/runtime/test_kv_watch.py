"""A decode waiting for a room's KV does not wait out --kv-timeout for a prefill that is gone
(bootstrap.py: ``await_kv`` asks ``GET /kv/room/{room}``): real aiohttp servers on loopback, a
real KVBootstrap, the prefill's death and its restart played by stopping/replacing the server."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
import pytest
from aiohttp import web

from epdctl.runtime.openai_api import ApiError
from epdctl.runtime.servers.bootstrap import KVBootstrap, await_kv, register_route, route_for_first

KEY = "s3cret-kv"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _serve(boot: KVBootstrap, port: int) -> web.AppRunner:
    runner = web.AppRunner(boot.app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, reuse_address=True).start()
    return runner


async def _never() -> tuple[dict, dict]:
    await asyncio.sleep(3600)
    raise AssertionError("unreachable")


@pytest.mark.parametrize("how", ["killed", "restarted"])
def test_a_waiting_decode_gives_up_within_seconds_when_its_prefill_is_gone(how: str) -> None:
    port = _port()

    async def run() -> tuple[float, ApiError]:
        boot = KVBootstrap(api_key=KEY)
        runner = await _serve(boot, port)
        async with aiohttp.ClientSession() as s:
            await register_route(s, "127.0.0.1", port, 42, "tcp://127.0.0.1:1", headers=AUTH)
            recv = asyncio.ensure_future(_never())
            waiting = asyncio.ensure_future(await_kv(recv, s, "127.0.0.1", port, 42, AUTH, kv_timeout=30,
                                                     every=0.2))
            await asyncio.sleep(1.0)
            assert not waiting.done()  # the prefill is alive and knows the room: keep waiting
            await runner.cleanup()     # the prefill dies (kill -9 closes its sockets) ...
            if how == "restarted":     # ... or comes back on the same port without the room
                runner = await _serve(KVBootstrap(api_key=KEY), port)
            t0 = time.monotonic()
            with pytest.raises(ApiError) as err:
                await waiting
            recv.cancel()
        await runner.cleanup()
        return time.monotonic() - t0, err.value

    took, err = asyncio.run(run())
    assert err.status == 503 and err.code == "prefill_lost", err.message
    assert f"127.0.0.1:{port}" in err.message and "bootstrap_room 42" in err.message
    assert took < 5.0  # not the 30 s --kv-timeout


def test_the_kv_bootstrap_takes_the_cluster_key_and_reports_rooms() -> None:
    port = _port()

    async def run() -> list[int]:
        boot = KVBootstrap(api_key=KEY)
        runner = await _serve(boot, port)
        base = f"http://127.0.0.1:{port}"
        out = []
        async with aiohttp.ClientSession() as s:
            for method, path, body, headers in (
                    ("POST", "/kv/route", {"room": 7, "reply_to": "tcp://x:1"}, {}),
                    ("POST", "/kv/route", {"room": 7, "reply_to": "tcp://x:1"}, {"Authorization": "Bearer nope"}),
                    ("GET", "/kv/room/7", None, {}),
                    ("POST", "/kv/route", {"room": 7, "reply_to": "tcp://x:1"}, AUTH),
                    ("GET", "/kv/room/7", None, AUTH),
                    ("GET", "/kv/room/8", None, AUTH)):
                async with s.request(method, base + path, json=body, headers=headers) as r:
                    out.append(r.status)
            assert await boot.wait_route("7", 1.0) == "tcp://x:1"
            async with s.get(base + "/kv/room/7", headers=AUTH) as r:  # taken: its KV is on its way
                out.append(r.status)
                assert (await r.json())["state"] == "sending"
        await runner.cleanup()
        return out

    assert asyncio.run(run()) == [401, 401, 401, 200, 200, 404, 200]


def test_a_kv_timeout_is_still_a_504_naming_the_flag() -> None:
    async def run() -> ApiError:
        async def late() -> tuple[dict, dict]:
            raise asyncio.TimeoutError
        async with aiohttp.ClientSession() as s:
            with pytest.raises(ApiError) as err:
                await await_kv(asyncio.ensure_future(late()), s, "127.0.0.1", 1, 5, kv_timeout=3)
        return err.value

    err = asyncio.run(run())
    assert err.status == 504 and err.code == "kv_timeout" and "--kv-timeout" in err.message


def test_a_route_already_registered_is_taken_without_waiting() -> None:
    async def run() -> None:
        boot = KVBootstrap()
        assert boot.take_route("9") is None  # unknown: the prefill falls back to waiting
        boot.set_route("9", "zmq+tcp://x:1")
        assert boot.take_route("9") == "zmq+tcp://x:1"
        assert boot.knows("9") and len(boot) == 0  # taken: reported as sending, not waiting
        assert boot.take_route("9") is None  # consumed once
        waiter = asyncio.ensure_future(boot.wait_route("10", 1.0))
        await asyncio.sleep(0)
        assert boot.take_route("10") is None  # a prefill already waits on it: not ready yet
        boot.set_route("10", "zmq+tcp://x:2")
        assert await waiter == "zmq+tcp://x:2"

    asyncio.run(run())


def test_a_decode_that_asks_for_the_first_token_gets_it_as_the_answer_to_its_route() -> None:
    port = _port()

    async def run() -> None:
        boot = KVBootstrap()
        runner = await _serve(boot, port)
        async with aiohttp.ClientSession() as s:
            token = {"kind": "first", "token": 7, "prompt_len": 3}
            asking = asyncio.ensure_future(route_for_first(s, "127.0.0.1", port, 11, "zmq+tcp://x:1", timeout=10))
            without = asyncio.ensure_future(route_for_first(s, "127.0.0.1", port, 13, "zmq+tcp://x:3", timeout=10))
            await register_route(s, "127.0.0.1", port, 12, "zmq+tcp://x:2")  # an older decode: KV only
            assert await boot.wait_route("11", 5.0) == "zmq+tcp://x:1"
            await asyncio.sleep(0.2)
            assert not asking.done()  # held until the prefill has the token
            assert boot.wants_first("11") and not boot.wants_first("11")  # asked once
            written = boot.give_first("11", token)
            assert written is not None and await asyncio.wait_for(asking, 5) == token
            await asyncio.wait_for(written, 5)  # the prefill knows its answer is on the socket
            assert boot.take_route("12") == "zmq+tcp://x:2" and not boot.wants_first("12")
            assert boot.give_first("12", token) is None  # nobody waits for a token of room 12
            assert await boot.wait_route("13", 5.0) == "zmq+tcp://x:3"
            boot.give_first("13", None)  # the prefill failed: no token, the error follows on the transport
            assert await asyncio.wait_for(without, 5) is None
            with pytest.raises(ApiError) as err:  # nobody listens: fails at once, as registering does
                await route_for_first(s, "127.0.0.1", _port(), 14, "zmq+tcp://x:4", timeout=10)
            assert err.value.code == "bootstrap_failed"
        await runner.cleanup()

    asyncio.run(run())
