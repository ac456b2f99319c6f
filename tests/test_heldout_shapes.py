"""scripts/heldout_shapes.py: the independent drawings the tiny model is scored on."""

from __future__ import annotations

import io
import random

from PIL import Image

from heldout_shapes import CANVAS, SHADES, _miss, draw_one, text_at

from epdctl.shapes import Item


def test_drawings_decode_and_cover_every_style() -> None:
    rng = random.Random(11)
    styles, items = set(), set()
    for _ in range(80):
        d = draw_one(rng)
        img = Image.open(io.BytesIO(d.png))
        assert img.format == ("JPEG" if d.jpeg else "PNG")
        assert img.width == img.height and img.width in CANVAS
        styles.add((d.outline, d.noisy, d.jpeg))
        items.add(d.item)
        assert d.item.colour in SHADES
    assert len(styles) == 8 and len(items) == 12


def test_question_positions_and_miss_kinds() -> None:
    rng = random.Random(2)
    assert text_at(rng, "before", 5) == 0 and text_at(rng, "after", 5) == 5
    assert {text_at(rng, "between", 4) for _ in range(100)} == {1, 2, 3}
    want = Item("circle", "red")
    assert _miss(want, want) == "right"
    assert _miss(Item("square", "red"), want) == "shape"
    assert _miss(Item("circle", "blue"), want) == "colour"
    assert _miss(Item("square", "blue"), want) == "both"
    assert _miss(None, want) == "unnamed"
