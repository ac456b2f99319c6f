"""lab/model/tiny_vlm_misses.py: its breakdown of held-out misses agrees with heldout_shapes.py."""

from __future__ import annotations

from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "tiny-qwen2vl"

import heldout_shapes  # noqa: E402
from tiny_vlm_misses import Read, collect, tally  # noqa: E402

from epdctl.shapes import Item  # noqa: E402


def test_tally_splits_by_cell_and_names_the_confusion() -> None:
    red_sq, red_ci, blue_tr = Item("square", "red"), Item("circle", "red"), Item("triangle", "blue")
    reads = [Read("before", 3, red_sq, True, red_ci),       # shape wrong, colour right
             Read("before", 3, red_sq, False, red_sq),
             Read("after", 8, blue_tr, True, red_sq),       # both wrong
             Read("between", 2, blue_tr, False, None)]      # not named
    t = tally(reads)
    assert t["per_image"] == 0.25 and t["images"] == 4
    assert t["by_position_and_count"] == {"before": {"3": 0.5}, "between": {"2": 0.0},
                                          "after": {"8": 0.0}}
    assert t["by_shape_and_style"]["square outlined"] == 0.0
    assert t["by_shape_and_style"]["square filled"] == 1.0
    assert t["confusions"] == {"square outlined -> circle": 1,
                               "triangle outlined -> red square": 1,
                               "triangle filled -> unnamed": 1}


def test_the_breakdown_scores_the_same_draw_as_heldout_shapes() -> None:
    torch.set_num_threads(1)
    reads = collect(MODEL, requests=1, seed=31)
    ref = heldout_shapes.evaluate(MODEL, requests=1, seed=31)
    t = tally(reads)
    assert t["images"] == ref["all"]["images"] == 36 + 35 + 36  # 1..8 images; "between" needs 2+
    assert t["per_image"] == ref["all"]["per_image"]
    for position in heldout_shapes.POSITIONS:
        hits = [r.got == r.want for r in reads if r.position == position]
        assert round(sum(hits) / len(hits), 4) == ref["per_position"][position]["per_image"]
