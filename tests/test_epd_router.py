"""epdctl's E->P->D router (epdctl/node/epd_router.py): its admin surface, as epdctl's router
client reads it, and the command render writes for it. Requests through it to real vLLM
servers: tests/e2e/test_vllm_cpu.py."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Iterator

import pytest

from epdctl.http.routerctl import RouterClient
from epdctl.node import epd_router
from epdctl.render import build_plan
from epdctl.render.router import registers_workers
from epdctl.topology import load_topology

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def router() -> Iterator[tuple[str, epd_router.Pool]]:
    pool = epd_router.Pool()
    server = epd_router.Router(("127.0.0.1", 0), pool, ["encode", "prefill", "decode"], None, 10.0)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", pool
    finally:
        server.shutdown()
        server.server_close()


def test_admin_surface_as_epdctl_reads_it(router: tuple[str, epd_router.Pool]) -> None:
    url, pool = router
    client = RouterClient(url)
    assert client.alive()
    ready, doc = client.readiness()
    assert not ready and doc["missing"] == ["encode", "prefill", "decode"]
    wid = client.add_worker("http://127.0.0.1:1/", "prefill")
    assert client.add_worker("http://127.0.0.1:1", "prefill") == wid  # one record per URL
    listed = client.workers()
    assert [(w.url, w.worker_type, w.healthy) for w in listed] == [("http://127.0.0.1:1", "prefill", False)]
    pool.check(timeout=0.5)  # nothing listens on port 1: stays out of rotation
    assert client.find("http://127.0.0.1:1") is not None and not client.find("http://127.0.0.1:1").healthy  # type: ignore[union-attr]
    client.remove_worker(wid)
    assert client.workers() == []


def test_requests_without_a_healthy_worker_are_503(router: tuple[str, epd_router.Pool]) -> None:
    from epdctl.http.probes import http

    url, _ = router
    r = http("POST", url + "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status == 503 and b"no healthy decode worker" in r.body


def test_api_key_guards_everything_but_health() -> None:
    from epdctl.http.probes import http

    server = epd_router.Router(("127.0.0.1", 0), epd_router.Pool(), ["decode"], "k3y", 10.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert http("GET", url + "/health").ok
        assert http("GET", url + "/workers").status == 401
        assert http("GET", url + "/workers", headers={"Authorization": "Bearer k3y"}).ok
    finally:
        server.shutdown()
        server.server_close()


def test_media_items_are_every_image_in_order() -> None:
    body = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "a"}}, {"type": "text", "text": "q"},
        {"type": "image_url", "image_url": {"url": "b"}}]}]}
    assert [i["image_url"]["url"] for i in epd_router.media_items(body)] == ["a", "b"]


def test_rendered_router_names_every_worker_and_parses() -> None:
    plan = build_plan(load_topology(ROOT / "topologies" / "vllm-cpu-epd.yaml"))
    assert plan.router is not None
    argv = list(plan.router.argv)
    assert argv[1:3] == ["-m", "epdctl.node.epd_router"]
    assert not registers_workers(argv)  # the command names its workers
    urls = {str(w.role): w.url for w in plan.workers}
    flags = argv[3:]
    for flag, role in (("--encode", "encoder"), ("--prefill", "prefill"), ("--decode", "decode")):
        assert flags[flags.index(flag) + 1] == urls[role]
    with pytest.raises(SystemExit):  # its own parser refuses what it does not know
        epd_router.main([*flags, "--no-such-flag"])
