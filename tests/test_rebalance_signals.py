"""The --auto policy's per-role signals: busy time exported by the workers, read as utilisation.

The workers' side is the real code (``BusyClock``, ``ModelThread``, ``own_work_metrics`` on a real
``Registry``), served over real HTTP; the collector reads it as `rebalance --auto` does. Sample
times are given explicitly, so the rates are exact and nothing here is timed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Iterator

import pytest

from epdctl.rebalance.auto import AutoState, Policy, Sample, decide
from epdctl.rebalance.signals import Collector
from epdctl.runtime.metrics import Registry
from epdctl.runtime.servers.busy import BusyClock, own_work_metrics
from epdctl.runtime.servers.common import ModelThread


def test_busy_clock_counts_only_the_time_inside_and_sees_a_running_span() -> None:
    clock = BusyClock()
    assert clock.total() == 0.0 and not clock.active
    with clock:
        time.sleep(0.05)
        mid = clock.total()
        assert clock.active and mid >= 0.05
    done = clock.total()
    time.sleep(0.05)
    assert clock.total() == done >= mid  # idle time is not counted; never goes back


def test_model_thread_busy_time_and_own_waiting_calls() -> None:
    async def main() -> tuple[float, list[int]]:
        thread = ModelThread("t")
        gate = threading.Event()
        first = asyncio.ensure_future(thread.run(gate.wait, 5))
        rest = [asyncio.ensure_future(thread.run(time.sleep, 0.02)) for _ in range(3)]
        await asyncio.sleep(0.1)
        seen = [thread.pending, thread.waiting]  # 4 submitted, 1 running, 3 queued behind it
        gate.set()
        await asyncio.gather(first, *rest)
        seen.append(thread.waiting)
        thread.shutdown()
        return thread.busy.total(), seen

    busy, seen = asyncio.run(main())
    assert seen == [4, 3, 0]
    assert busy >= 0.05 + 3 * 0.02  # the gated call (most of the 0.1 s) and the three sleeps


class Worker:
    """A worker's /metrics as the runtime renders it; busy seconds and own queue set by the test."""

    def __init__(self, role: str) -> None:
        self.busy = 0.0
        self.own = 0
        self.registry = Registry(f"epd_{role}")
        self.registry.gauge("queue_depth", "outside view", lambda: 7.0)  # mixes stages: ignored
        own_work_metrics(self.registry, lambda: self.busy, lambda: self.own)


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        w = self.server.workers.get(self.path.split("/")[1])  # type: ignore[attr-defined]
        body = w.registry.render().encode() if w is not None and self.path.endswith("/metrics") else b""
        self.send_response(200 if body else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture()
def cluster() -> Iterator[tuple[dict[str, Worker], str]]:
    workers = {"e0": Worker("encoder"), "p0": Worker("prefill"), "d0": Worker("decode"),
               "d1": Worker("decode")}
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.workers = workers  # type: ignore[attr-defined]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield workers, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def plan(base: str, roles: dict[str, str]) -> list[SimpleNamespace]:
    return [SimpleNamespace(role=r, url=f"{base}/{name}", is_leader=True) for name, r in roles.items()]


ROLES = {"e0": "encoder", "p0": "prefill", "d0": "decode", "d1": "decode"}


def test_collector_turns_busy_seconds_into_utilisation_and_uses_the_own_queue(cluster) -> None:
    workers, base = cluster
    c = Collector(prometheus_url=None, api_key_env=None)
    first = c.sample(100.0, plan(base, ROLES))
    assert first.util == {}  # a rate needs two looks
    assert first.queue == {"encoder": 0.0, "prefill": 0.0, "decode": 0.0}  # own queues, not 7s
    assert first.loads["encoder"] == 7.0  # the outside view is kept for the log
    workers["e0"].busy, workers["e0"].own = 1.9, 3     # 1.9 s busy in 2 s
    workers["p0"].busy = 0.4
    workers["d0"].busy, workers["d1"].busy = 0.2, 0.6
    s = c.sample(102.0, plan(base, ROLES))
    assert s.util == pytest.approx({"encoder": 0.95, "prefill": 0.2, "decode": 0.2})
    assert s.queue == {"encoder": 3.0, "prefill": 0.0, "decode": 0.0}
    assert s.counts == {"encoder": 1, "prefill": 1, "decode": 2}


def test_a_worker_switched_in_place_starts_its_rate_over(cluster) -> None:
    workers, base = cluster
    c = Collector(prometheus_url=None, api_key_env=None)
    workers["d1"].busy = 50.0
    c.sample(0.0, plan(base, ROLES))
    workers["d1"].busy = 51.0
    assert c.sample(2.0, plan(base, ROLES)).util["decode"] == pytest.approx(0.25)  # (0 + 0.5) / 2
    moved = {**ROLES, "d1": "encoder"}       # same URL, new role: no rate from the old counter
    workers["d1"] = Worker("encoder")         # the new role's servers, counting from zero
    workers["d1"].busy = 0.3
    s = c.sample(4.0, plan(base, moved))
    assert s.counts["encoder"] == 2 and s.util["encoder"] == 0.0  # only e0 has a rate yet
    workers["d1"].busy = 0.1                  # a counter that went back counts from zero
    s = c.sample(5.0, plan(base, moved))
    assert s.util["encoder"] == pytest.approx(0.05)  # mean of e0 0.0 and d1 0.1 s in 1 s


def _sample(t: float, util: dict[str, float], counts: dict[str, int]) -> Sample:
    return Sample(t=t, counts=counts, queue={r: 0.0 for r in counts}, util=util)


def test_busy_encoder_is_short_and_idle_encoders_are_the_surplus() -> None:
    """The two phases of a changing load, as utilisations: images-heavy makes the encoder short
    (decode gives), text-only makes the second encoder the spare one (decode gains it back)."""
    pol = Policy(sustain=2, cooldown=10)
    st, props = AutoState(), []
    layout = {"encoder": 1, "prefill": 1, "decode": 2}
    for t in range(0, 40, 2):
        images = t < 20
        util = ({"encoder": 0.97, "prefill": 0.25, "decode": 0.2} if images
                else {"encoder": 0.0, "prefill": 0.3, "decode": 0.9})
        prop, st = decide(pol, st, _sample(t, util, dict(layout)))
        if prop is not None:
            props.append((t, prop.target, prop.source))
            layout[prop.target] += 1
            layout[prop.source] -= 1
    assert [(p[1], p[2]) for p in props] == [("encoder", "decode"), ("decode", "encoder")]
    assert props[0][0] < 20 <= props[1][0]


def test_a_busy_role_in_the_hysteresis_band_neither_asks_nor_gives() -> None:
    pol = Policy(sustain=1)
    counts = {"encoder": 1, "prefill": 1, "decode": 2}
    # decode 0.5 busy: not short (< 0.8) and not spare (> 0.3), so the short encoder waits
    assert decide(pol, AutoState(), _sample(0, {"encoder": 0.95, "decode": 0.5}, counts))[0] is None
    prop = decide(pol, AutoState(), _sample(0, {"encoder": 0.95, "decode": 0.3}, counts))[0]
    assert prop is not None and (prop.target, prop.source) == ("encoder", "decode")


def test_a_window_averages_the_utilisation_over_several_looks(cluster) -> None:
    """With ``window`` 4 s and a look every 2 s, each utilisation covers the last 4 s, so one
    noisy 2 s stretch moves it half as much; with no window it is the last 2 s alone."""
    workers, base = cluster
    smooth, raw = Collector(None, window=4.0, api_key_env=None), Collector(None, api_key_env=None)
    busy = 0.0
    got = []
    for i, step in enumerate([1.8, 1.8, 0.6, 1.8]):  # busy seconds in each 2 s stretch
        workers["e0"].busy = busy
        s, r = smooth.sample(2.0 * i, plan(base, ROLES)), raw.sample(2.0 * i, plan(base, ROLES))
        got.append((s.util.get("encoder"), r.util.get("encoder")))
        busy += step
    workers["e0"].busy = busy
    got.append((smooth.sample(8.0, plan(base, ROLES)).util["encoder"],
                raw.sample(8.0, plan(base, ROLES)).util["encoder"]))
    assert got[0] == (None, None)
    assert got[1] == (pytest.approx(0.9), pytest.approx(0.9))      # only 2 s seen yet
    assert got[2] == (pytest.approx(0.9), pytest.approx(0.9))      # 4 s: both stretches at 0.9
    assert got[3] == (pytest.approx(0.6), pytest.approx(0.3))      # the dip, halved by the window
    assert got[4] == (pytest.approx(0.6), pytest.approx(0.9))


# Utilisations `rebalance --auto --log-json` recorded on the live 1E/1P/2D cluster of
# tests/e2e/test_rebalance_auto_live.py (six clients on two shared cores), one row per 2 s
# sample: the images phase before and after the encoder gained decode-1, then the text phase.
# The second encoder halves each encoder's busy time while the images keep coming, and the
# prefill, now fed twice as fast, turns short.
RECORDED = [  # (encoder, prefill, decode) busy per worker
    ("images", 0.70, 0.64, 0.32), ("images", 0.73, 0.61, 0.31), ("images", 0.71, 0.61, 0.29),
    ("images", 0.72, 0.58, 0.29), ("images", 0.71, 0.55, 0.22),
    ("images", 0.65, 0.50, 0.41), ("images", 0.35, 0.49, 0.40), ("images", 0.43, 0.53, 0.45),
    ("images", 0.33, 0.71, 0.42), ("images", 0.29, 0.86, 0.36), ("images", 0.20, 0.89, 0.30),
    ("images", 0.23, 0.90, 0.31), ("images", 0.22, 0.88, 0.33), ("images", 0.25, 0.91, 0.30),
    ("text", 0.10, 0.20, 0.80), ("text", 0.0, 0.21, 0.96), ("text", 0.0, 0.19, 0.96),
    ("text", 0.0, 0.15, 0.97), ("text", 0.0, 0.20, 0.97), ("text", 0.0, 0.18, 0.96),
]


def test_the_role_a_move_grew_keeps_its_worker_while_its_load_goes_on() -> None:
    """Replayed: the encoder gains a decode under images; when its two workers then look idle
    (0.2 each) beside a busy prefill it does not give one away (its 0.4 of work would land on
    one worker, above busy-low), and under text it gives the worker back to the decodes."""
    pol = Policy(busy_high=0.7, sustain=3, cooldown=15)
    st, moves = AutoState(), []
    layout = {"encoder": 1, "prefill": 1, "decode": 2}
    for i, (phase, enc, pre, dec) in enumerate(RECORDED):
        s = _sample(2.0 * i, {"encoder": enc, "prefill": pre, "decode": dec}, dict(layout))
        prop, st = decide(pol, st, s)
        if prop is not None:
            moves.append((phase, prop.target, prop.source))
            layout[prop.target] += 1
            layout[prop.source] -= 1
    assert moves == [("images", "encoder", "decode"), ("text", "decode", "encoder")], moves
    assert layout == {"encoder": 1, "prefill": 1, "decode": 2}
    # without the memory of the last move the same samples undo it under images
    undo = AutoState(last_move=0.0)
    counts = {"encoder": 2, "prefill": 1, "decode": 1}
    for t in (100.0, 102.0, 104.0):
        prop, undo = decide(pol, undo, _sample(t, {"encoder": 0.23, "prefill": 0.9,
                                                   "decode": 0.31}, counts))
    assert prop is not None and (prop.target, prop.source) == ("prefill", "encoder")
