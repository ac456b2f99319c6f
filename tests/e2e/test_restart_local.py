"""Supervision on a real local cluster: kill -9 of each role's worker under load, no operator.

This module's own cluster (`epdctl up` on a copy of topologies/local.yaml, ports 36300-36399,
``restart: {policy: on-failure, backoff: 1.0}``), a client thread sending real image requests
through smg with the openai client the whole time, and for each of encoder-0, prefill-0,
decode-0 and the router: the worker process itself (not its supervisor) is killed with SIGKILL,
the supervisor restarts it, and the service comes back by itself; after the first success every
request succeeds. The recovery time per role is printed (run with -s to see it).
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import openai
import pytest
import yaml

from epdctl import shapes

from own_cluster import local_copy

ROOT = Path(__file__).resolve().parents[2]
BASE = 36300
NAME = "restart-e2e"


class Env:
    def __init__(self, tmp: Path):
        doc = local_copy(NAME, BASE)
        doc["restart"] = {"policy": "on-failure", "limit": 5, "backoff": 1.0}
        doc["router"]["policy"] = "round_robin"  # the rebalance test sees every decode serve
        self.topology = tmp / f"{NAME}.yaml"
        self.topology.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.state = tmp / "state"
        self.env = dict(os.environ, EPDCTL_STATE_DIR=str(self.state))
        self.router_url = ""

    def epdctl(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "epdctl", *args], env=self.env, cwd=ROOT,
                              text=True, capture_output=True, timeout=timeout)

    def pid_file(self, worker: str) -> dict[str, Any]:
        path = self.state / "clusters" / NAME / "run" / f"{worker}.pid.json"
        return json.loads(path.read_text())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    e = Env(tmp_path_factory.mktemp("restart"))
    up = e.epdctl("up", str(e.topology), "--timeout", "600", "--no-canary")
    try:
        assert up.returncode == 0, f"epdctl up failed:\n{up.stdout}\n{up.stderr}"
        state = json.loads((e.state / "clusters" / NAME / "state.json").read_text())
        e.router_url = next(p["url"] for p in state["processes"] if p["role"] == "router")
        yield e
    finally:
        down = e.epdctl("down", NAME)
        assert down.returncode == 0, down.stdout + down.stderr


class Load:
    """Requests back to back from one thread; each outcome with its time."""

    def __init__(self, url: str):
        self.client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                                    timeout=60)
        self.outcomes: list[tuple[float, bool, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _one(self, seed: int) -> None:
        pngs, question, items = shapes.make_request(random.Random(seed), 1, plain=True)
        parts: list[dict] = [{"type": "image_url", "image_url": {
            "url": "data:image/png;base64," + base64.b64encode(p).decode()}} for p in pngs]
        parts.append({"type": "text", "text": question})
        r = self.client.chat.completions.create(model="tiny-qwen2vl", max_tokens=8,
                                                messages=[{"role": "user", "content": parts}],  # type: ignore[list-item]
                                                temperature=0)
        assert r.choices[0].message.content

    def _run(self) -> None:
        seed = 0
        while not self._stop.is_set():
            seed += 1
            t0 = time.monotonic()  # outcomes carry the START time: a request in flight at the
            try:                   # kill may still succeed, and must not count as "service back"
                self._one(seed)
                self.outcomes.append((t0, True, ""))
            except Exception as e:  # noqa: every failure is recorded and judged by the test
                self.outcomes.append((t0, False, f"{type(e).__name__}: {e}"[:200]))
                time.sleep(0.2)

    def __enter__(self) -> "Load":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(90)


@pytest.mark.parametrize("worker", ["encoder-0", "prefill-0", "decode-0", "router"])
def test_kill_9_of_a_worker_under_load_recovers_without_an_operator(cluster: Env,
                                                                    worker: str) -> None:
    with Load(cluster.router_url) as load:
        deadline = time.monotonic() + 120
        while not any(ok for _, ok, _ in load.outcomes) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert any(ok for _, ok, _ in load.outcomes), load.outcomes[-3:]
        before = cluster.pid_file(worker)
        deadline = time.monotonic() + 30  # the supervisor probes health once a second
        while before["state"] != "running" and time.monotonic() < deadline:
            time.sleep(0.2)
            before = cluster.pid_file(worker)
        assert before["state"] == "running", before
        t_kill = time.monotonic()
        os.kill(before["child_pid"], signal.SIGKILL)
        # the supervisor restarts it ...
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            now = cluster.pid_file(worker)
            if now["restarts"] == before["restarts"] + 1 and now["state"] == "running":
                break
            time.sleep(0.2)
        assert now["restarts"] == before["restarts"] + 1, now
        assert now["last_exit"] == "killed by signal 9 (SIGKILL)"
        # ... and the service comes back by itself: first success after the kill, then 0 failures
        while time.monotonic() < deadline:
            if any(ok and t > t_kill for t, ok, _ in load.outcomes):
                break
            time.sleep(0.2)
        back = next((t for t, ok, _ in load.outcomes if ok and t > t_kill), None)
        assert back is not None, [o for o in load.outcomes if o[0] > t_kill][-3:]
        while (sum(t > back for t, _, _ in load.outcomes) < 10
               and time.monotonic() < deadline):
            time.sleep(0.2)
    after = [o for o in load.outcomes if o[0] > back]
    failed_during = [o for o in load.outcomes if o[0] > t_kill and o[0] < back and not o[1]]
    print(f"\n{worker}: service back {back - t_kill:.1f}s after kill -9 "
          f"({len(failed_during)} failed request(s) in between)")
    assert len(after) >= 10 and all(ok for _, ok, _ in after), [o for o in after if not o[1]]
    status = cluster.epdctl("status", NAME, "--json", timeout=120)
    row = next(w for w in json.loads(status.stdout)["workers"] if w["name"] == worker)
    assert row["restarts"] == now["restarts"] and row["last_exit"] == now["last_exit"]
    assert row["alive"] and row["healthy"]
    text = cluster.epdctl("status", NAME, timeout=120).stdout
    assert f"{worker}: killed by signal 9 (SIGKILL); restarted" in text


def test_a_restarted_router_keeps_the_workers_rebalance_added(cluster: Env) -> None:
    """Runs last (it moves encoder-1): `rebalance --decode +1 --from encoder` registers the new
    decode through POST /workers only; after kill -9 of smg the supervisor restarts it with every
    worker it had, and requests reach both decodes again without an operator."""
    move = cluster.epdctl("rebalance", NAME, "--decode", "+1", "--from", "encoder", "-y", "--no-verify")
    assert move.returncode == 0, move.stdout + move.stderr
    state = json.loads((cluster.state / "clusters" / NAME / "state.json").read_text())
    decodes = {p["url"].rstrip("/") for p in state["processes"] if p["role"] == "decode"}
    assert len(decodes) == 2, state["processes"]
    routed = _routed_decodes(cluster.router_url, 16)
    assert routed == decodes, routed
    time.sleep(2.5)  # the router's supervisor reads its worker list every 2 s
    before = cluster.pid_file("router")
    t_kill = time.monotonic()
    os.kill(before["child_pid"], signal.SIGKILL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        now = cluster.pid_file("router")
        if now["restarts"] == before["restarts"] + 1 and now["state"] == "running":
            break
        time.sleep(0.2)
    seen: set[str] = set()
    while seen != decodes and time.monotonic() < deadline:
        try:
            seen = _routed_decodes(cluster.router_url, 16)
        except Exception:  # noqa: refused / 503 until smg has its workers back
            time.sleep(0.2)
    print(f"\nrouter (after rebalance): both decodes served again {time.monotonic() - t_kill:.1f}s after kill -9")
    assert seen == decodes, seen
    log = (cluster.state / "clusters" / NAME / "logs" / "router.log").read_text()
    assert "router restarts with the 3 worker(s) it had" in log  # the prefill and both decodes


def _routed_decodes(url: str, n: int) -> set[str]:
    """The decode each of ``n`` text requests went to (smg's x-smg-routed-worker-id header)."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    seen = set()
    for i in range(n):
        raw = client.chat.completions.with_raw_response.create(
            model="tiny-qwen2vl", max_tokens=2, temperature=0,
            messages=[{"role": "user", "content": f"count to {i} {random.random()}"}])
        seen.add(raw.headers["x-smg-routed-worker-id"].rstrip("/"))
    return seen
