"""Live role reassignment on a real local cluster while a client keeps sending requests.

A 1-encoder / 1-prefill / 2-decode embedded cluster (ports 38000-38099, state in tmp) is started
once with `epdctl up`. A client thread sends multi-image requests (the official `openai` client,
2-4 images, through the smg router) the whole time while the test runs
`rebalance --encoder +1 --from decode --yes`, then `rebalance --decode +1 --from encoder --yes`,
then a move whose new role is made to fail (test-only argv injection) and must roll back.
No request may fail; worker counts must match what was asked, seen three ways (router
`/workers`, the prefill's `/list_encoder_urls`, `epdctl status`); `history` records all three.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest
import yaml

from epdctl import shapes
from epdctl.canary import build_messages
from epdctl.http.probes import http
from epdctl.rebalance.execute import INJECT_ENV

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "tiny-qwen2vl"
BASE = 38000


@dataclass
class Live:
    name: str
    env: dict[str, str]
    router: str
    registry: str        # prefill-0's encoder registry
    state_file: Path

    def epdctl(self, *args: str, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "epdctl", *args], env=env or self.env,
                              cwd=ROOT, text=True, capture_output=True, timeout=900)


def topology(tmp: Path, name: str = "rb-live", base: int = BASE, **extra: Any) -> Path:
    """A 1 E / 1 P / 2 D embedded topology on one shared local node (``extra``: more top-level keys)."""
    doc = {
        "name": name, "engine": "embedded", "launcher": "local",
        "model": {"path": str(MODEL), "served_name": "tiny-qwen2vl",
                  "architecture": "Qwen2VLForConditionalGeneration"},
        "ports": {"base": base, "limit": base + 99},
        "transfer": {"backend": "zmq"},
        **extra,
        "nodes": [{"name": "local", "host": "127.0.0.1", "shared": True}],
        "roles": {"encoder": {"nodes": ["local"], "count": 1},
                  "prefill": {"nodes": ["local"], "count": 1},
                  "decode": {"nodes": ["local"], "count": 2}},
        "router": {"node": "local", "host": "127.0.0.1", "implementation": "smg"},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def live_cluster(tmp: Path, path: Path) -> Iterator[Live]:
    """`epdctl up` the topology at ``path`` (state under ``tmp``), yield it, `down` it and check
    that no recorded process is left (a generator for a module fixture)."""
    from epdctl.render import build_plan
    from epdctl.topology import load_topology

    topo = load_topology(path)
    plan = build_plan(topo)
    assert plan.router is not None
    pre = next(w for w in plan.workers if w.role == "prefill")
    env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp / "state"))
    env.pop(INJECT_ENV, None)
    c = Live(topo.name, env, plan.router.url, f"http://127.0.0.1:{pre.encoder_bootstrap_port}",
             tmp / "state" / "clusters" / topo.name / "state.json")
    up = c.epdctl("up", str(path), "--timeout", "600")
    pids: set[int] = set()
    try:
        assert up.returncode == 0, f"epdctl up failed:\n{up.stdout}\n{up.stderr}"
        yield c
    finally:
        if c.state_file.exists():
            pids = {p["handle"]["pid"] for p in json.loads(c.state_file.read_text())["processes"]}
        down = c.epdctl("down", c.name)
        assert down.returncode == 0, down.stdout + down.stderr
        left = [p for p in pids if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert not left, f"processes left after down: {left}"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("rebalance")
    # the restart path (stop, start, load, ready) and its rollback: in place is the default
    yield from live_cluster(tmp, topology(tmp, rebalance={"in_place": False}))


@dataclass
class Client:
    """Sends requests back to back until stopped; records every outcome."""

    router: str
    results: list[dict[str, Any]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        from openai import OpenAI

        api = OpenAI(base_url=self.router + "/v1", api_key="none", max_retries=0, timeout=180)
        rng = random.Random(7)
        while not self.stop.is_set():
            n = rng.randint(2, 4)
            pngs, question, items = shapes.make_request(rng, n, plain=True)
            try:
                r = api.chat.completions.create(model="tiny-qwen2vl", max_tokens=48,
                                                temperature=0.0,
                                                messages=build_messages(pngs, question))
                text = r.choices[0].message.content or ""
                got = shapes.parse_answer(text, n)
                self.results.append({"ok": True, "n": n, "text": text,
                                     "named": sum(g is not None for g in got),
                                     "correct": got == items,
                                     "finish": r.choices[0].finish_reason})
            except Exception as e:  # noqa: BLE001 - every failure is recorded and asserted on
                self.results.append({"ok": False, "error": repr(e)[:300]})


def counts(c: Live) -> dict[str, Any]:
    workers = http("GET", c.router + "/workers", timeout=10).json()["workers"]
    routed = {"prefill": 0, "decode": 0}
    for w in workers:
        if w["worker_type"] in routed and w.get("is_healthy"):
            routed[w["worker_type"]] += 1
    encoders = http("GET", c.registry + "/list_encoder_urls", timeout=10).json()["encoder_urls"]
    st = c.epdctl("status", c.name, "--json")
    view = json.loads(st.stdout)
    summary = {r: (v["ready"], v["total"]) for r, v in view["summary"].items()}
    return {"router": routed, "registry": len(encoders), "status": summary,
            "healthy": view["healthy"]}


def expect(c: Live, enc: int, pre: int, dec: int) -> None:
    got = counts(c)
    assert got["router"] == {"prefill": pre, "decode": dec}, got
    assert got["registry"] == enc, got
    assert got["status"]["encoder"] == (enc, enc), got
    assert got["status"]["prefill"] == (pre, pre), got
    assert got["status"]["decode"] == (dec, dec), got
    assert got["healthy"], got


def test_rebalance_under_load_then_rollback(live: Live) -> None:
    client = Client(live.router)
    thread = threading.Thread(target=client.run, daemon=True)
    thread.start()
    try:
        expect(live, 1, 1, 2)
        r1 = live.epdctl("rebalance", live.name, "--encoder", "+1", "--from", "decode", "--yes")
        assert r1.returncode == 0, r1.stdout + r1.stderr
        assert "decode-1 (decode) -> encoder-1 (encoder)" in r1.stdout
        expect(live, 2, 1, 1)
        served_during_1 = len(client.results)

        r2 = live.epdctl("rebalance", live.name, "--decode", "+1", "--from", "encoder", "--yes")
        assert r2.returncode == 0, r2.stdout + r2.stderr
        expect(live, 1, 1, 2)

        bad = dict(live.env, **{INJECT_ENV: "--no-such-flag"})
        r3 = live.epdctl("rebalance", live.name, "--encoder", "+1", "--from", "decode", "--yes",
                         env=bad)
        assert r3.returncode == 1, r3.stdout + r3.stderr
        assert "rolled_back" in r3.stdout and "unrecognized arguments" in r3.stdout
        expect(live, 1, 1, 2)  # back in its old role, registered with the router
    finally:
        client.stop.set()
        thread.join(timeout=300)

    failures = [r for r in client.results if not r["ok"]]
    assert not failures, failures
    assert served_during_1 > 0 and len(client.results) > served_during_1
    assert all(r["finish"] in ("stop", "length") and r["named"] >= 1 for r in client.results)
    # models/tiny-qwen2vl/training_report.json: ~0.9 of 2-4 image requests exactly right
    correct = sum(r["correct"] for r in client.results)
    assert correct >= len(client.results) // 2, (correct, len(client.results))

    hist = live.epdctl("history", live.name, "--json")
    records = [json.loads(ln) for ln in hist.stdout.splitlines()]
    assert [r["outcome"] for r in records] == ["done", "done", "rolled_back"]
    moves = [(r["moves"][0]["move"]["worker"], r["moves"][0]["move"]["new_name"]) for r in records]
    assert moves == [("decode-1", "encoder-1"), ("encoder-1", "decode-1"),
                     ("decode-1", "encoder-1")]
    for r in records[:2]:
        steps = r["moves"][0]["steps"]
        assert set(steps) == {"drain", "stop", "start", "ready", "register", "verify"}
        assert r["moves"][0]["link"]["bytes"] > 0
    assert "rollback" in records[2]["moves"][0]["steps"]
    assert "--no-such-flag" in records[2]["moves"][0]["error"]
    text = live.epdctl("history", live.name).stdout
    assert text.count("decode-1 (decode) -> encoder-1 (encoder)") == 2
    assert "rolled_back" in text

    # the rolled-back decode really serves: a request on exactly the prefill-0/decode-1 pair
    from epdctl.rebalance.links import pd_pair
    from epdctl.render import build_plan
    from epdctl.topology import load_topology

    plan = build_plan(load_topology(Path(json.loads(live.state_file.read_text())["topology"])))
    spec = {w.name: w for w in plan.workers}
    assert pd_pair(spec["prefill-0"], spec["decode-1"], "tiny-qwen2vl")["answer"]
