"""The generated-shapes vocabulary: drawing, answers and answer parsing (no torch)."""

from __future__ import annotations

import io
import random

import pytest
from PIL import Image

from epdctl import shapes
from epdctl.shapes import Item


def test_plain_drawing_is_centred_on_white_with_the_exact_colour() -> None:
    img = shapes.draw("circle", "blue")
    assert img.size == (112, 112) and img.mode == "RGB"
    assert img.getpixel((56, 56)) == shapes.COLOURS["blue"]
    assert img.getpixel((1, 1)) == shapes.WHITE
    assert img.getpixel((110, 110)) == shapes.WHITE


def test_shapes_differ_where_they_should() -> None:
    # A circle leaves the square's corners empty; a triangle leaves its upper sides empty.
    circle, square, triangle = (shapes.draw(s, "red") for s in shapes.SHAPES)
    corner = (56 + 30, 56 + 30)
    assert square.getpixel(corner) == shapes.COLOURS["red"]
    assert circle.getpixel(corner) == shapes.WHITE
    upper_left = (56 - 25, 56 - 20)
    assert triangle.getpixel(upper_left) == shapes.WHITE
    assert square.getpixel(upper_left) == shapes.COLOURS["red"]


@pytest.mark.parametrize("bad", [("hexagon", "red"), ("circle", "purple")])
def test_draw_rejects_unknown_names(bad: tuple[str, str]) -> None:
    with pytest.raises(ValueError, match="unknown"):
        shapes.draw(*bad)


def test_random_items_cover_the_vocabulary_and_vary() -> None:
    rng = random.Random(0)
    seen, sizes, backgrounds = set(), set(), set()
    for _ in range(400):
        img, item = shapes.random_item(rng)
        seen.add(item)
        sizes.add(img.size)
        backgrounds.add(img.getpixel((0, 0)))
        assert item.shape in shapes.SHAPES and item.colour in shapes.COLOURS
    assert len(seen) == len(shapes.SHAPES) * len(shapes.COLOURS)
    assert len(sizes) > 3
    assert shapes.WHITE in backgrounds and len(backgrounds) > 10


def test_random_item_colour_is_present_in_the_image() -> None:
    rng = random.Random(1)
    for _ in range(100):
        img, item = shapes.random_item(rng)
        assert shapes.COLOURS[item.colour] in {c for _, c in img.getcolors(1 << 16)}


def test_plain_random_item_is_the_plain_drawing() -> None:
    img, item = shapes.random_item(random.Random(3), plain=True)
    assert img.tobytes() == shapes.draw(item.shape, item.colour).tobytes()


def test_same_seed_same_images() -> None:
    a = shapes.make_request(random.Random(42), 4)
    b = shapes.make_request(random.Random(42), 4)
    assert a == b


def test_make_request_returns_pngs_question_and_items() -> None:
    pngs, q, items = shapes.make_request(random.Random(5), 3, plain=True)
    assert q == shapes.question() == "What is in each image?"
    assert len(pngs) == len(items) == 3
    for png, item in zip(pngs, items):
        img = Image.open(io.BytesIO(png))
        assert img.format == "PNG"
        assert img.convert("RGB").getpixel((56, 56)) == shapes.COLOURS[item.colour]
    with pytest.raises(ValueError, match="at least one image"):
        shapes.make_request(random.Random(5), 0)


def test_answer_format_is_indexed_one_line_per_image() -> None:
    items = [Item("circle", "red"), Item("square", "blue"), Item("triangle", "green")]
    assert shapes.answer_for(items) == (
        "Picture 1: red circle\nPicture 2: blue square\nPicture 3: green triangle"
    )


def test_parse_answer_round_trips() -> None:
    rng = random.Random(9)
    for n in range(1, 9):
        _, _, items = shapes.make_request(rng, n)
        assert shapes.parse_answer(shapes.answer_for(items), n) == items


def test_parse_answer_places_by_index_and_marks_missing() -> None:
    text = "Picture 3: Yellow Square\nPicture 1: red circle\nPicture 9: blue circle"
    assert shapes.parse_answer(text, 3) == [Item("circle", "red"), None, Item("square", "yellow")]


def test_parse_answer_accepts_other_index_styles_and_bare_lists() -> None:
    assert shapes.parse_answer("1. blue triangle, 2) red square", 2) == [
        Item("triangle", "blue"), Item("square", "red")]
    assert shapes.parse_answer("a green circle and a red square", 3) == [
        Item("circle", "green"), Item("square", "red"), None]
    assert shapes.parse_answer("no idea", 2) == [None, None]
    assert shapes.parse_answer("", 0) == []


@pytest.mark.parametrize("plain", [True, False])
def test_distinct_colours_give_every_image_its_own_colour_and_draw_it(plain: bool) -> None:
    seen_same_colour = False
    for seed in range(200):
        pngs, _, items = shapes.make_request(random.Random(seed), 3, plain=plain, distinct_colours=True)
        assert len({it.colour for it in items}) == 3
        for png, item in zip(pngs, items):  # the picture shows the colour the item names
            img = Image.open(io.BytesIO(png)).convert("RGB")
            assert shapes.COLOURS[item.colour] in {c for _, c in img.getcolors(1 << 16)}
        default = shapes.make_request(random.Random(seed), 3, plain=plain)[2]
        seen_same_colour |= len({it.colour for it in default}) < 3
    assert seen_same_colour  # without the flag colours repeat (the model's known miss needs that)


def test_distinct_colours_leave_the_default_draw_unchanged_and_refuse_too_many() -> None:
    # the accuracy figures are measured on fixed seeds: the default draw must not move (these are
    # the items the code before the flag drew; it matched it on 600 requests of 5 images)
    assert [str(i) for i in shapes.make_request(random.Random(777), 4, plain=True)[2]] == \
        ["yellow circle", "blue square", "blue triangle", "red square"]
    assert [str(i) for i in shapes.make_request(random.Random(777), 3)[2]] == \
        ["yellow circle", "yellow triangle", "blue circle"]
    with pytest.raises(ValueError, match="cannot each have their own colour"):
        shapes.make_request(random.Random(1), len(shapes.COLOURS) + 1, distinct_colours=True)
