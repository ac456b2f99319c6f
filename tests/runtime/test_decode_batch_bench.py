"""benchmarks/bench_decode_batch.py: both sides decode the same requests, a run's join step is
timed apart from its steady steps, and the summary's ratios are batched over alone."""

from __future__ import annotations

import pytest

import bench_decode_batch as bench

from tiny_model import prefilled


@pytest.fixture(scope="module")
def results(bundle, images):
    return prefilled(bundle, images, 3)


@pytest.mark.parametrize("mode", list(bench.MODES))
def test_a_run_decodes_every_token_and_times_its_join_step(bundle, results, mode):
    r = bench.run(bundle, results, mode, 6)
    assert r["tokens"] == 3 * 6
    assert r["steps"] == (5 if not bench.MODES[mode] else 7)  # joining: the last stream joins two steps late
    assert 0 < r["join_s"] < r["wall_s"] and r["cpu_s"] > 0
    pooled = bench.pooled([r])
    assert pooled["tokens_per_s"] == pytest.approx(18 / r["wall_s"])
    assert pooled["steady_ms"] == pytest.approx((r["wall_s"] - r["join_s"]) / (r["steps"] - 1) * 1e3)


def test_summary_is_batched_over_the_same_requests_alone():
    def side(tps: float, ms: float) -> dict:
        return {"tokens_per_s": tps, "tokens_per_cpu_s": tps * 1.1, "steady_ms": ms, "join_ms": 1.0}

    turns = [(side(8000, 2.0), side(900, 1.1)), (side(6000, 2.5), side(1000, 1.0)), (side(7000, 2.2), side(800, 1.2))]
    s = bench.summary(turns, 16)
    assert s["x_least"] == pytest.approx(8000 / 1000)  # each side's best turn
    assert s["x_median"] == pytest.approx(7000 / 900)
    assert s["x_turns_median"] == pytest.approx(7000 / 800)  # per turn: 8000/900, 6000/1000, 7000/800
    assert s["x_steady_least"] == pytest.approx(16 * 1.0 / 2.0)
    assert s["x_steady_median"] == pytest.approx(16 * 1.1 / 2.2)
