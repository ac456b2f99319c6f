"""RoleHost without a model: the dispatcher, the refusals (busy, wrong address, no key) and the
restore of the old role when the new one cannot start, over real HTTP on loopback."""

from __future__ import annotations

import argparse
import asyncio
import socket
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from epdctl.runtime.metrics import Registry
from epdctl.runtime.servers.common import Served, json_response, make_app, read_json, start_runners, stop_runners
from epdctl.runtime.servers.switchable import RoleHost


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("role")
    p.add_argument("--model-path", default="/m")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--extra-port", type=int, default=None)
    return p.parse_args(argv)


class Fake:
    def __init__(self, role: str):
        self.role, self.busy, self.stopped = role, False, False
        self.metrics = Registry(f"epd_{role}")
        self.hits = self.metrics.counter("requests_total", "requests")

    async def hello(self, _: web.Request) -> web.Response:
        self.hits.inc()
        return json_response({"role": self.role})

    async def on_stop(self) -> None:
        self.stopped = True


def make_build(made: list[Fake]):
    async def build(args: Any, bundle: Any) -> Served:
        fake = Fake(args.role)
        made.append(fake)
        app = make_app()
        app.router.add_get("/hello", fake.hello)
        app.router.add_get(f"/only_{args.role}", fake.hello)
        extra = [(make_app(), "127.0.0.1", args.extra_port)] if args.extra_port else []
        return Served(args.role, fake, app, extra, on_stop=fake.on_stop, idle=lambda: not fake.busy)
    return build


async def scenario(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    made: list[Fake] = []
    args = parse(["encoder", "--port", str(port)])
    host = RoleHost(args, bundle=None, parse=parse, build=make_build(made))
    runners = await start_runners([(host.app(), "127.0.0.1", port)])
    base = f"http://127.0.0.1:{port}"
    try:
        await host.bring(args)
        async with aiohttp.ClientSession() as s:
            async def get(path: str) -> tuple[int, Any]:
                async with s.get(base + path) as r:
                    return r.status, await r.json()

            async def switch(argv: list[str], headers: dict[str, str] | None = None) -> tuple[int, Any]:
                async with s.post(base + "/admin/switch_role", json={"argv": argv}, headers=headers) as r:
                    return r.status, await r.json()

            assert await get("/only_encoder") == (200, {"role": "encoder"})
            made[0].busy = True
            status, doc = await switch(["decode", "--port", str(port)])
            assert status == 409 and doc["error"]["code"] == "not_idle"
            made[0].busy = False
            status, doc = await switch(["decode", "--port", str(port + 1)])
            assert status == 400 and "restart it instead" in doc["error"]["message"]
            status, doc = await switch(["colocated", "--port", str(port)])
            assert status == 400
            # the new role needs a port someone holds: the old role comes back
            with socket.socket() as taken:
                taken.bind(("127.0.0.1", 0))
                taken.listen()
                busy = taken.getsockname()[1]
                status, doc = await switch(["decode", "--port", str(port), "--extra-port", str(busy)])
            assert status == 500 and "serves as encoder again" in doc["error"]["message"]
            assert host.current is not None and host.current.role == "encoder"
            assert (await get("/hello"))[1] == {"role": "encoder"}
            # a real switch; the encoder's route is gone, the counters of a role continue
            assert (await switch(["decode", "--port", str(port)]))[0] == 200
            assert (await get("/only_encoder"))[0] == 404
            assert await get("/only_decode") == (200, {"role": "decode"})
            assert (await switch(["encoder", "--port", str(port)]))[0] == 200
            await get("/hello")
            async with s.get(base + "/metrics") as r:
                text = await r.text()
            assert "epd_encoder_requests_total 3" in text   # three encoder instances, one series
            assert 'epd_worker_role_switches_total{outcome="done"} 2' in text
            assert 'epd_worker_role_switches_total{outcome="rolled_back"} 1' in text
            # with a cluster key the route needs it
            monkeypatch.setenv("EPD_TEST_KEY", "k1")
            host.key_env = "EPD_TEST_KEY"              # what --api-key-env sets at start
            assert (await switch(["decode", "--port", str(port)]))[0] == 401
            ok = await switch(["decode", "--port", str(port)], {"Authorization": "Bearer k1"})
            assert ok[0] == 200 and ok[1]["old_role"] == "encoder"
        assert all(f.stopped for f in made[:-1])
    finally:
        await stop_runners(runners)
        await stop_runners(host.extra)


def test_role_host(monkeypatch: pytest.MonkeyPatch) -> None:
    asyncio.run(scenario(monkeypatch))


async def body_limits() -> None:
    """The dispatcher reads a body with the current role's own limit (make_app(max_body_bytes))."""
    port = free_port()
    limits = {"encoder": 1000, "decode": 100_000}

    async def build(args: Any, bundle: Any) -> Served:
        async def echo(request: web.Request) -> web.Response:
            return json_response({"n": len((await read_json(request))["x"])})
        app = make_app(limits[args.role])
        app.router.add_post("/echo", echo)
        return Served(args.role, Fake(args.role), app)

    args = parse(["encoder", "--port", str(port)])
    host = RoleHost(args, bundle=None, parse=parse, build=build)
    runners = await start_runners([(host.app(), "127.0.0.1", port)])
    base = f"http://127.0.0.1:{port}"
    try:
        await host.bring(args)
        async with aiohttp.ClientSession() as s:
            async def echo(n: int) -> tuple[int, Any]:
                async with s.post(base + "/echo", json={"x": "a" * n}) as r:
                    return r.status, await r.json()

            assert await echo(10) == (200, {"n": 10})
            status, doc = await echo(5000)
            assert status == 413 and "limit of 1000 bytes" in doc["error"]["message"]
            async with s.post(base + "/admin/switch_role", json={"argv": ["decode", "--port", str(port)]}) as r:
                assert r.status == 200
            assert await echo(5000) == (200, {"n": 5000})
            status, doc = await echo(200_000)
            assert status == 413 and "limit of 100000 bytes" in doc["error"]["message"]
    finally:
        await stop_runners(runners)


def test_role_host_body_limit_follows_the_role() -> None:
    asyncio.run(body_limits())
