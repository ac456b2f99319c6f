"""Training-side style augmentation for the tiny Qwen2-VL: the same vocabulary drawn many ways.

:func:`epdctl.shapes.random_item` draws filled shapes in exact RGB on near-white canvases. To
read shapes drawn by anyone else, training also sees (each chosen at random per image):
filled or outlined (stroke 2-13% of the side), canvas 48-288 px, shapes 0.17-0.42 of the side
anywhere on the canvas, squares and triangles turned up to 20 degrees, shades around several
anchors per colour name, white / tinted / grey backgrounds, optional 2-3x supersampled
anti-aliasing, slight blur, Gaussian or uniform noise and a JPEG round trip (quality 25-90).

Independent of ``scripts/heldout_shapes.py`` (the evaluation draws with its own code), so the
held-out figure measures generalisation, not a copy of the generator.
"""

from __future__ import annotations

import io
import random

import torch
from PIL import Image, ImageDraw, ImageFilter

from epdctl import shapes

# Several shades a person would call by each name; each is jittered further per image.
ANCHORS: dict[str, tuple[tuple[int, int, int], ...]] = {
    "red": ((255, 0, 0), (215, 25, 30), (235, 55, 35), (180, 10, 10)),
    "green": ((0, 128, 0), (35, 170, 55), (15, 200, 35), (0, 100, 45), (60, 150, 40)),
    "blue": ((0, 0, 255), (30, 70, 225), (20, 40, 170), (40, 90, 250)),
    "yellow": ((255, 255, 0), (245, 225, 25), (250, 235, 90), (235, 215, 0)),
}
JITTER = 22


def shade(rng: random.Random, colour: str) -> tuple[int, int, int]:
    base = rng.choice(ANCHORS[colour])
    r, g, b = (min(255, max(0, c + rng.randint(-JITTER, JITTER))) for c in base)
    return (r, g, b)


def background(rng: random.Random) -> tuple[int, int, int]:
    u = rng.random()
    if u < 0.35:
        return shapes.WHITE
    if u < 0.65:
        g = rng.randint(200, 250)
        return (g, g, g)
    return (rng.randint(205, 255), rng.randint(205, 255), rng.randint(205, 255))


def _shape(d: ImageDraw.ImageDraw, shape: str, x: float, y: float, r: float, rot: float,
           fill: tuple[int, int, int] | None, outline: tuple[int, int, int] | None,
           width: int) -> None:
    if shape == "circle":
        d.ellipse([x - r, y - r, x + r, y + r], fill=fill, outline=outline, width=width)
    elif shape == "square":
        d.regular_polygon((x, y, r * 1.2), 4, rotation=rot, fill=fill, outline=outline,
                          width=width)
    else:
        d.regular_polygon((x, y + r * 0.15, r * 1.12), 3, rotation=rot, fill=fill,
                          outline=outline, width=width)


def _noise(rng: random.Random, img: Image.Image) -> Image.Image:
    t = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).float()
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    amp = rng.uniform(2.0, 14.0)
    if rng.random() < 0.5:
        t += torch.randn(t.shape, generator=gen) * amp
    else:
        t += (torch.rand(t.shape, generator=gen) * 2 - 1) * amp * 1.7
    return Image.frombytes("RGB", img.size, t.clamp(0, 255).to(torch.uint8).numpy().tobytes())


def styled_item(rng: random.Random, colour: str | None = None) -> tuple[Image.Image, shapes.Item]:
    """One random shape/colour drawn in a random style (see the module docstring); ``colour``
    overrides the drawn colour (the rng is drawn the same either way)."""
    item = shapes.Item(rng.choice(shapes.SHAPES), rng.choice(list(shapes.COLOURS)))
    if colour is not None:
        item = shapes.Item(item.shape, colour)
    side = rng.randint(48, 288)
    ss = rng.choice((1, 1, 2, 3))
    big = side * ss
    img = Image.new("RGB", (big, big), background(rng))
    d = ImageDraw.Draw(img)
    scale = rng.uniform(0.17, 0.42)
    r = scale * big
    slack = max(0.0, 0.5 - scale * 1.3 - 0.02)
    x = big * (0.5 + rng.uniform(-slack, slack))
    y = big * (0.5 + rng.uniform(-slack, slack))
    rot = rng.uniform(-20.0, 20.0)
    col = shade(rng, item.colour)
    if rng.random() < 0.5:
        width = max(1, round(big * rng.uniform(0.02, 0.13)))
        _shape(d, item.shape, x, y, r, rot, None, col, width)
    else:
        _shape(d, item.shape, x, y, r, rot, col, None, 0)
    if ss > 1:
        img = img.resize((side, side), rng.choice((Image.BILINEAR, Image.BICUBIC, Image.LANCZOS)))
    if rng.random() < 0.2:
        img = img.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 1.2)))
    if rng.random() < 0.5:
        img = _noise(rng, img)
    if rng.random() < 0.5:
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=rng.randint(25, 90))
        img = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    return img, item


def question_at(rng: random.Random, n: int, mix: float) -> int:
    """Where the question goes among ``n`` images: after them (index n) unless, with probability
    ``mix``, before them (0) or between two of them (1..n-1), half and half."""
    if not mix or rng.random() >= mix:
        return n
    if n == 1 or rng.random() < 0.5:
        return 0
    return rng.randint(1, n - 1)
