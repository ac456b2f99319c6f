"""In-place rebalance on a real local cluster: an encoder becomes a decode and back without a
restart, while a client keeps sending requests whose answers must not change.

A 1-encoder / 1-prefill / 2-decode embedded cluster, started switchable by default (no ``rebalance`` key; ports
38200-38299) is started with `epdctl up`. A fixed set of multi-image requests is answered once
(greedy, one client, so no batching can change a token); then a client cycles through the same
requests the whole time `rebalance --encoder +1 --from decode --yes` and `rebalance --decode +1
--from encoder --yes` run. Every answer must be byte-identical to its first answer, the moved
worker must keep its process (pid) and port, and history must show the in-place path (a
``switch`` step, no ``stop``/``start``/``ready``).
"""

from __future__ import annotations

import json
import random
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

import pytest

from epdctl import shapes
from epdctl.canary import build_messages

from test_rebalance_live import Live, expect, live_cluster, topology

BASE = 38200


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("inplace")
    yield from live_cluster(tmp, topology(tmp, "rb-inplace", BASE))


REQUESTS = [shapes.make_request(random.Random(seed), 2 + seed % 3, plain=True) for seed in range(6)]


def ask(api: Any, i: int) -> str:
    pngs, question, _ = REQUESTS[i]
    r = api.chat.completions.create(model="tiny-qwen2vl", max_tokens=48, temperature=0.0,
                                    messages=build_messages(pngs, question))
    return r.choices[0].message.content or ""


@dataclass
class SameAnswers:
    """Cycles through REQUESTS until stopped; every answer is compared with the first one."""

    router: str
    first: dict[int, str]
    results: list[dict[str, Any]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        from openai import OpenAI

        api = OpenAI(base_url=self.router + "/v1", api_key="none", max_retries=0, timeout=180)
        i = 0
        while not self.stop.is_set():
            k = i % len(REQUESTS)
            try:
                text = ask(api, k)
                self.results.append({"ok": True, "k": k, "same": text == self.first[k]})
            except Exception as e:  # noqa: BLE001 - every failure is recorded and asserted on
                self.results.append({"ok": False, "k": k, "error": repr(e)[:300]})
            i += 1


def pid_port(c: Live, worker: str) -> tuple[int, int]:
    procs = json.loads(c.state_file.read_text())["processes"]
    p = next(p for p in procs if p["name"] == worker)
    return p["handle"]["pid"], p["port"]


def test_encoder_to_decode_and_back_in_place(live: Live) -> None:
    from openai import OpenAI

    api = OpenAI(base_url=live.router + "/v1", api_key="none", max_retries=0, timeout=180)
    first = {i: ask(api, i) for i in range(len(REQUESTS))}
    assert all(first.values())
    client = SameAnswers(live.router, first)
    thread = threading.Thread(target=client.run, daemon=True)
    before = pid_port(live, "decode-1")
    thread.start()
    try:
        expect(live, 1, 1, 2)
        r1 = live.epdctl("rebalance", live.name, "--encoder", "+1", "--from", "decode", "--yes")
        assert r1.returncode == 0, r1.stdout + r1.stderr
        assert "decode-1 (decode) -> encoder-1 (encoder)" in r1.stdout
        assert "path: in-place (POST /admin/switch_role" in r1.stdout
        expect(live, 2, 1, 1)
        assert pid_port(live, "encoder-1") == before      # same process, same port
        served_1 = len(client.results)

        r2 = live.epdctl("rebalance", live.name, "--decode", "+1", "--from", "encoder", "--yes")
        assert r2.returncode == 0, r2.stdout + r2.stderr
        expect(live, 1, 1, 2)
        assert pid_port(live, "decode-1") == before
    finally:
        client.stop.set()
        thread.join(timeout=300)

    failures = [r for r in client.results if not r["ok"]]
    assert not failures, failures
    changed = [r for r in client.results if not r["same"]]
    assert not changed, changed
    assert served_1 > 0 and len(client.results) > served_1

    records = [json.loads(ln) for ln in live.epdctl("history", live.name, "--json").stdout.splitlines()]
    assert [r["outcome"] for r in records] == ["done", "done"]
    for r in records:
        move = r["moves"][0]
        assert move["taken"] == "in-place" and move["move"]["path"] == "in-place"
        assert set(move["steps"]) == {"drain", "switch", "register", "verify"}, move["steps"]
        assert move["link"]["bytes"] > 0
