"""What `up`'s and `canary`'s report shows of a canary run (render_status.render_canary)."""

from __future__ import annotations

from epdctl.canary.request import CanaryResult
from epdctl.commands.render_status import render_canary


def test_durations_are_shown_and_the_workers_wall_clock_stamps_are_not() -> None:
    res = CanaryResult(question="What is in each image?", expected="Picture 1: red square",
                       answer="Picture 1: red square", correct=True, named=1, n_images=1,
                       seconds=0.149, model="tiny-qwen2vl",
                       timings={"encode_ms": 48.43, "kv_bytes": 136660.0, "t_prefill_in": 1796147188.02,
                                "t_kv_in": 1796147188.1, "ttft_ms": 75.0})
    out = render_canary(res)
    assert "verdict:  correct  (149 ms end to end)" in out
    line = next(x for x in out.splitlines() if x.startswith("  timings:"))
    assert line == "  timings:  encode_ms=48.4 kv_bytes=136660.0 ttft_ms=75.0"
