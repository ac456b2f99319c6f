"""Training data for the tiny Qwen2-VL's stage 4: question placement and styled drawings."""

from __future__ import annotations

import random

import pytest

from tiny_vlm_common import messages_for
from tiny_vlm_styles import ANCHORS, question_at, styled_item

from epdctl import shapes


def _order(msgs: list[dict]) -> list[str]:
    return [p["type"] for p in msgs[0]["content"]]


def test_messages_place_the_question_anywhere() -> None:
    assert _order(messages_for(2, "q")) == ["image", "image", "text"]
    assert _order(messages_for(2, "q", 0)) == ["text", "image", "image"]
    assert _order(messages_for(3, "q", 1)) == ["image", "text", "image", "image"]
    with pytest.raises(ValueError, match="outside 0..2"):
        messages_for(2, "q", 3)


def test_question_at_leaves_rng_alone_when_off_and_covers_all_places_when_on() -> None:
    rng = random.Random(1)
    state = rng.getstate()
    assert question_at(rng, 5, 0.0) == 5
    assert rng.getstate() == state  # stages 1-3 reproduce bit for bit
    seen = {question_at(rng, 4, 1.0) for _ in range(200)}
    assert seen == {0, 1, 2, 3}
    assert {question_at(rng, 1, 1.0) for _ in range(50)} == {0}


def test_styled_items_cover_the_vocabulary_and_keep_the_named_colour() -> None:
    rng = random.Random(3)
    seen = set()
    for _ in range(120):
        img, item = styled_item(rng)
        assert img.mode == "RGB" and 48 <= img.width == img.height <= 288
        seen.add((item.shape, item.colour))
        # The most saturated pixel is closest to one of the item's own colour anchors.
        raw = img.tobytes()
        pixels = [tuple(raw[i:i + 3]) for i in range(0, len(raw), 3)]
        px = max(pixels, key=lambda c: max(c) - min(c))
        dist = {name: min(sum((a - b) ** 2 for a, b in zip(px, anc)) for anc in anchors)
                for name, anchors in ANCHORS.items()}
        assert min(dist, key=dist.get) == item.colour, (item, px)
    assert len(seen) == len(shapes.SHAPES) * len(shapes.COLOURS)


def test_shared_colour_requests_reuse_one_or_two_colours_and_leave_rng_alone_when_off() -> None:
    from tiny_vlm_data import palette

    rng = random.Random(5)
    state = rng.getstate()
    assert palette(rng, 4, 0.0) == [] and palette(rng, 1, 1.0) == []
    assert rng.getstate() == state  # stages before --shared-colour reproduce bit for bit
    sizes = {len(palette(rng, 4, 1.0)) for _ in range(100)}
    assert sizes == {1, 2}
    got = palette(rng, 3, 1.0)
    assert set(got) <= set(shapes.COLOURS)


@pytest.mark.parametrize("draw", ["plain", "varied", "styled"])
def test_a_forced_colour_is_drawn_in_place_of_the_drawn_one(draw: str) -> None:
    def one(rng: random.Random, colour: str | None) -> tuple[object, shapes.Item]:
        if draw == "styled":
            return styled_item(rng, colour)
        return shapes.random_item(rng, plain=draw == "plain", colour=colour)

    for seed in range(12):
        img, item = one(random.Random(seed), "green")
        _, free = one(random.Random(seed), None)
        assert item == shapes.Item(free.shape, "green")
        raw = img.tobytes()
        px = max((tuple(raw[i:i + 3]) for i in range(0, len(raw), 3)),
                 key=lambda c: max(c) - min(c))
        dist = {name: min(sum((x - y) ** 2 for x, y in zip(px, anc)) for anc in anchors)
                for name, anchors in ANCHORS.items()}
        assert min(dist, key=dist.get) == "green"
