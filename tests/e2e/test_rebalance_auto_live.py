"""`rebalance --auto --apply` on a live cluster whose load changes shape, with clients throughout.

A 1-encoder / 1-prefill / 2-decode embedded cluster, switchable by default (ports
38400-38499) is started with `epdctl up`. Six client loops send through the router: 40 s of
images-heavy requests (16 never-seen images each, 8 tokens), then 40 s of text-only requests
(64 tokens). Beside them `epdctl rebalance --auto --apply` samples every 2 s (utilisation over
6 s, short at 0.7, sustain 3, cool-down 15 s). The policy must move a decode to the encoders during the images phase and an encoder back
to the decodes during the text phase, each in place and done; every move the policy made must be
in the phase that asks for it (no flapping), moves must be a cool-down apart, the cluster must end
as it started, and no request may fail. The busy-time signals it logged must show the encoder as
the busiest role under images and idle under text.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from epdctl.bench.phases import Phase, PhasedLoad

from test_rebalance_live import ROOT, Live, expect, live_cluster, topology

BASE = 38400
PHASE_S = 40.0
INTERVAL, WINDOW, SUSTAIN, COOLDOWN = 2.0, 6.0, 3, 15.0
BUSY_HIGH = 0.7  # six client loops on two shared cores keep the encoder near 0.8, not above it


def settled(c: Live, enc: int, pre: int, dec: int, settle: float = 30.0) -> None:
    """``expect``, retried while the router's health view catches up (1 s health checks)."""
    deadline = time.monotonic() + settle
    while True:
        try:
            return expect(c, enc, pre, dec)
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("auto")
    yield from live_cluster(tmp, topology(tmp, "rb-auto", BASE))


def test_auto_moves_toward_the_encoder_under_images_and_back_under_text(live: Live,
                                                                         tmp_path: Path) -> None:
    settled(live, 1, 1, 2)
    load = PhasedLoad(live.router, [Phase("images", PHASE_S, images=16, max_tokens=8),
                                    Phase("text", PHASE_S, max_tokens=64)], clients=6)
    log = tmp_path / "auto.jsonl"
    load.start()
    auto = subprocess.Popen(
        [sys.executable, "-m", "epdctl", "rebalance", live.name, "--auto", "--apply",
         "--interval", str(INTERVAL), "--window", str(WINDOW), "--sustain", str(SUSTAIN),
         "--cooldown", str(COOLDOWN), "--busy-high", str(BUSY_HIGH),
         "--iterations", str(int(2 * PHASE_S / INTERVAL)), "--log-json", str(log)],
        env=live.env, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        load.join(timeout=2 * PHASE_S + 120)
        out, _ = auto.communicate(timeout=120)
    finally:
        load.stop.set()
        if auto.poll() is None:
            auto.kill()
            auto.wait()
    assert auto.returncode == 0, out
    assert "Traceback" not in out, out

    failed = [r for r in load.records if not r.ok]
    assert not failed, failed[:5]
    (_, img_a, img_b), (_, txt_a, txt_b) = load.bounds()
    assert load.summary(img_a, img_b)["requests"] > 0 and load.summary(txt_a, txt_b)["requests"] > 0

    records = [json.loads(ln) for ln in live.epdctl("history", live.name, "--json").stdout.splitlines()]
    assert len(records) >= 2, out
    moves = [(r["started"], r["moves"][0]) for r in records]
    for r in records:
        assert r["outcome"] == "done" and r["request"]["auto"] is True, r
    for at, m in moves:       # every move points where its phase asks: none against the load
        want = ("decode", "encoder") if at < img_b else ("encoder", "decode")
        assert (m["move"]["old_role"], m["move"]["new_role"]) == want, (at - img_a, m["move"], out)
        assert m["taken"] == "in-place", m
    assert any(at < img_b for at, _ in moves) and any(at >= img_b for at, _ in moves), out
    starts = [r["started"] for r in records]
    assert all(b - a >= COOLDOWN for a, b in zip(starts, starts[1:])), starts
    settled(live, 1, 1, 2)    # one move there, one back

    samples = [json.loads(ln) for ln in log.read_text().splitlines()]
    first_move = min(starts)
    before = [s["util"] for s in samples if img_a <= s["t"] < first_move and s["util"]]
    text = [s["util"] for s in samples if s["t"] >= txt_a + WINDOW + INTERVAL and s["util"]]
    mean = lambda rows, r: statistics.mean(u.get(r, 0.0) for u in rows)  # noqa: E731
    assert before and mean(before, "encoder") > max(mean(before, "prefill"), mean(before, "decode"))
    assert text and mean(text, "encoder") <= 0.1 < mean(text, "decode")
