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


def _result(items: list[str], answer: str, model: str = "tiny-qwen2vl") -> CanaryResult:
    from epdctl.canary.request import find_misses
    from epdctl.shapes import Item, parse_answer

    drawn = [Item(s.split()[1], s.split()[0]) for s in items]
    got = parse_answer(answer, len(drawn))
    misses = find_misses(drawn, got)
    return CanaryResult(question="What is in each image?", answer=answer, correct=not misses,
                        expected="\n".join(f"Picture {i}: {s}" for i, s in enumerate(items, 1)),
                        named=sum(g == d for g, d in zip(got, drawn)), n_images=len(drawn), seconds=0.09,
                        misses=misses, model=model)


def test_a_same_colour_copy_is_named_as_the_models_known_miss() -> None:
    # the quick start's canary of 2026-12-02 (seed from the clock), answer as the cluster gave it
    out = render_canary(_result(["red square", "green square", "green triangle"],
                                "Picture 1: red square\nPicture 2: green triangle\nPicture 3: green triangle"))
    assert "verdict:  NOT correct (2/3 images named right)" in out
    assert "  miss:     Picture 2: green square read as green triangle (the item of Picture 3, same colour)" in out
    assert "the bundled\n            tiny model's known miss" in out
    assert "would point at the pipeline" in out


def test_a_wrong_colour_or_an_unnamed_picture_points_at_the_transfers() -> None:
    out = render_canary(_result(["red square", "blue circle", "green triangle"],
                                "Picture 1: red square\nPicture 2: red square"))
    assert "  miss:     Picture 2: blue circle read as red square (the item of Picture 1)" in out
    assert "  miss:     Picture 3: green triangle, not named" in out
    assert "epdctl check --canary CLUSTER" in out and "known miss" not in out


def test_a_right_answer_has_no_miss_lines() -> None:
    res = _result(["red square"], "Picture 1: red square")
    assert res.misses == [] and "miss" not in render_canary(res)


def test_another_models_same_colour_miss_is_not_blamed_on_the_tiny_model() -> None:
    out = render_canary(_result(["red square", "green square", "green triangle"],
                                "Picture 1: red square\nPicture 2: green triangle\nPicture 3: green triangle",
                                model="Qwen2-VL-7B-Instruct"))
    assert "(the item of Picture 3, same colour)" in out
    assert "a reading\n            miss of the model" in out and "tiny" not in out
