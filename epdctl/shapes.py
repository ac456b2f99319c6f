"""Generated-shapes images: the vocabulary the tiny Qwen2-VL checkpoint is trained on.

One module feeds training (``lab/model/train_tiny_vlm.py``), the tests, the post-launch canary
and the benchmarks, so every party draws the same kind of picture and scores answers the
same way. Stdlib at import (no torch, no Pillow): the control plane imports it. Plain pictures
(the canaries') come from ``shapes_plain/*.png``, drawn once by :func:`draw` and packaged, so a
core-only install (no ``runtime`` extra) can run canaries; varied ones need Pillow (lazy import).

Vocabulary: shapes ``circle``, ``square``, ``triangle``; colours ``red``, ``green``,
``blue``, ``yellow`` with exact RGB values (:data:`COLOURS`). A shape is large (radius
0.28-0.42 of the canvas side) so it survives the image processor's downscale to 56x56.

Prompt and answer format (why it looks like this): the chat template marks each image with
its position, ``Picture k: <|vision_start|><|image_pad|><|vision_end|>``, as real Qwen2-VL
does with ``add_vision_id``. The answer repeats that marker, one image per line::

    Picture 1: red circle
    Picture 2: blue square

Repeating the exact ``Picture k:`` tokens lets a 2-4 layer model bind the k-th answer line
to the k-th image by an induction-style lookup (find the image that follows the same index
token) instead of counting images, which is what makes 8-image requests learnable.
"""

from __future__ import annotations

import io
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL import Image

SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (255, 0, 0),
    "green": (0, 128, 0),
    "blue": (0, 0, 255),
    "yellow": (255, 255, 0),
}
WHITE: tuple[int, int, int] = (255, 255, 255)
DEFAULT_SIZE = 112
MIN_SCALE, MAX_SCALE = 0.28, 0.42
PLAIN_SCALE = 0.36
QUESTION = "What is in each image?"
PLAIN_DIR = Path(__file__).resolve().parent / "shapes_plain"  # <colour>-<shape>.png, see plain_png


@dataclass(frozen=True)
class Item:
    """One drawn object: what the model must name for one image."""

    shape: str
    colour: str

    def __str__(self) -> str:
        return f"{self.colour} {self.shape}"


def question() -> str:
    """The default prompt text sent after the images."""
    return QUESTION


def draw(
    shape: str,
    colour: str,
    *,
    size: int = DEFAULT_SIZE,
    scale: float = PLAIN_SCALE,
    cx: float = 0.5,
    cy: float = 0.5,
    background: tuple[int, int, int] = WHITE,
    rng: random.Random | None = None,
) -> Image.Image:
    """Draw one filled shape on a square RGB canvas.

    ``scale`` is the radius as a fraction of the side; ``cx``/``cy`` the centre as fractions.
    The defaults are the "plain" drawing (white, centred). ``rng`` only adds a tiny
    rotation to the triangle when given, so a plain call is fully deterministic.
    """
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; expected one of {', '.join(SHAPES)}")
    if colour not in COLOURS:
        raise ValueError(f"unknown colour {colour!r}; expected one of {', '.join(COLOURS)}")
    if size < 16:
        raise ValueError(f"image size {size} is too small; use at least 16 pixels")
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size, size), background)
    d = ImageDraw.Draw(img)
    r = scale * size
    x, y = cx * size, cy * size
    fill = COLOURS[colour]
    if shape == "circle":
        d.ellipse([x - r, y - r, x + r, y + r], fill=fill)
    elif shape == "square":
        h = r * 0.88
        d.rectangle([x - h, y - h, x + h, y + h], fill=fill)
    else:
        rot = rng.uniform(-8.0, 8.0) if rng is not None else 0.0
        d.regular_polygon((x, y + r * 0.15, r * 1.1), 3, rotation=rot, fill=fill)
    return img


def _background(rng: random.Random) -> tuple[int, int, int]:
    if rng.random() < 0.5:
        return WHITE
    return (rng.randint(200, 255), rng.randint(200, 255), rng.randint(200, 255))


def random_item(rng: random.Random, plain: bool = False,
                colour: str | None = None) -> tuple[Image.Image, Item]:
    """A random shape/colour; varied size, scale, position and background unless ``plain``.

    Plain images are what a person would draw by hand: 112 px, white, centred. ``colour``
    overrides the drawn colour (the rng is drawn the same either way).
    """
    item = Item(rng.choice(SHAPES), rng.choice(list(COLOURS)))
    if colour is not None:
        item = Item(item.shape, colour)
    if plain:
        return draw(item.shape, item.colour), item
    size = rng.choice((64, 84, 96, 112, 112, 128, 160))
    scale = rng.uniform(MIN_SCALE, MAX_SCALE)
    slack = max(0.0, 0.5 - scale - 0.04)
    cx = 0.5 + rng.uniform(-slack, slack)
    cy = 0.5 + rng.uniform(-slack, slack)
    img = draw(item.shape, item.colour, size=size, scale=scale, cx=cx, cy=cy,
               background=_background(rng), rng=rng)
    return img, item


def answer_for(items: list[Item]) -> str:
    """The exact text the trained model answers for :func:`question` about ``items``."""
    return "\n".join(f"Picture {i}: {it}" for i, it in enumerate(items, start=1))


_COLOUR_RE = "|".join(COLOURS)
_SHAPE_RE = "|".join(SHAPES)
_INDEXED = re.compile(
    rf"(?:picture|image)?\s*(\d+)\s*[:.)\-]\s*({_COLOUR_RE})\s+({_SHAPE_RE})", re.IGNORECASE
)
_BARE = re.compile(rf"\b({_COLOUR_RE})\s+({_SHAPE_RE})\b", re.IGNORECASE)


def parse_answer(text: str, n: int) -> list[Item | None]:
    """Read ``n`` items back from an answer; ``None`` where image k was not named.

    Indexed lines ("Picture 3: blue square", "3. blue square") are placed by their index;
    if the answer has no usable indices, bare "colour shape" pairs are taken in order.
    """
    out: list[Item | None] = [None] * n
    found = False
    for m in _INDEXED.finditer(text):
        k = int(m.group(1))
        if 1 <= k <= n and out[k - 1] is None:
            out[k - 1] = Item(m.group(3).lower(), m.group(2).lower())
            found = True
    if found:
        return out
    for i, m in enumerate(_BARE.finditer(text)):
        if i >= n:
            break
        out[i] = Item(m.group(2).lower(), m.group(1).lower())
    return out


def to_png(img: Image.Image) -> bytes:
    """Encode an image as PNG bytes (what a client sends as a data URL)."""
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


@lru_cache(maxsize=None)
def plain_png(shape: str, colour: str) -> bytes:
    """The plain drawing of ``colour shape`` as PNG bytes, from the packaged files (no Pillow)."""
    if shape not in SHAPES or colour not in COLOURS:
        raise ValueError(f"unknown item {colour} {shape}; shapes {', '.join(SHAPES)}, colours {', '.join(COLOURS)}")
    return (PLAIN_DIR / f"{colour}-{shape}.png").read_bytes()


def make_request(
    rng: random.Random, n_images: int, plain: bool = False, distinct_colours: bool = False
) -> tuple[list[bytes], str, list[Item]]:
    """``n_images`` random images as PNG bytes, the question, and the expected items.

    ``plain`` images need no Pillow (packaged PNGs); the rng is drawn exactly as random_item does.
    ``distinct_colours`` (up to one image per colour): every image its own colour, so an image
    read in another's place shows as a wrong colour — what a pipeline check wants; the tiny model's
    own miss, an image given the shape of another of the same colour, then cannot occur.
    """
    if n_images < 1:
        raise ValueError(f"a request needs at least one image, got {n_images}")
    if distinct_colours and n_images > len(COLOURS):
        raise ValueError(f"{n_images} images cannot each have their own colour; there are {len(COLOURS)}")
    colours = rng.sample(list(COLOURS), n_images) if distinct_colours else None
    pngs: list[bytes] = []
    items: list[Item] = []
    for i in range(n_images):
        if plain:
            item = Item(rng.choice(SHAPES), rng.choice(list(COLOURS)))
            if colours:
                item = Item(item.shape, colours[i])
            pngs.append(plain_png(item.shape, item.colour))
        else:
            img, item = random_item(rng, colour=colours[i] if colours else None)
            pngs.append(to_png(img))
        items.append(item)
    return pngs, question(), items
