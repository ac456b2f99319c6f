"""Held-out accuracy of the tiny Qwen2-VL on drawings made by a DIFFERENT script from training.

Nothing here comes from :mod:`epdctl.shapes` or the training generator except the vocabulary
(names of the 3 shapes and 4 colours), the question text and the answer parser (the answer
contract). The drawing is its own: shapes are polygons computed here, drawn 4x supersampled and
downscaled with LANCZOS (anti-aliased edges, unlike training's aliased ImageDraw shapes); filled
or outlined (thick strokes); other canvas sizes, shape sizes and positions; other shades within
each colour name; light grey or tinted backgrounds; mild Gaussian noise; a JPEG round trip.
The question stands before, between or after the images.

    PYTHONPATH=$PWD .venv/bin/python scripts/heldout_shapes.py [--model models/tiny-qwen2vl]
        [--requests 10] [--seed 777] [--out benchmarks/results/heldout_shapes.json]

Per-image accuracy = colour and shape both right; a request is right when every image is.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_vlm_common import answer, load  # noqa: E402

from epdctl.shapes import QUESTION, Item, parse_answer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SUPER = 4
CANVAS = (72, 96, 128, 150, 192, 224, 256)
# Shades that a person would still call by the name (lo, hi) per channel.
SHADES: dict[str, tuple[tuple[int, int], ...]] = {
    "red": ((185, 255), (0, 55), (0, 55)),
    "green": ((0, 70), (105, 200), (0, 80)),
    "blue": ((0, 60), (0, 90), (180, 255)),
    "yellow": ((225, 255), (210, 250), (0, 70)),
}
POSITIONS = ("before", "between", "after")


@dataclass
class Drawn:
    png: bytes
    item: Item
    outline: bool
    noisy: bool
    jpeg: bool


def _shade(rng: random.Random, colour: str) -> tuple[int, int, int]:
    r, g, b = (rng.randint(lo, hi) for lo, hi in SHADES[colour])
    return (r, g, b)


def _backdrop(rng: random.Random) -> tuple[int, int, int]:
    kind = rng.random()
    if kind < 0.4:
        return (255, 255, 255)
    if kind < 0.7:
        v = rng.randint(215, 245)
        return (v, v, v)
    return (rng.randint(235, 255), rng.randint(230, 255), rng.randint(215, 245))


def _polygon(shape: str, cx: float, cy: float, r: float, turn: float) -> list[tuple[float, float]]:
    """Vertices of the shape around (cx, cy), size ``r``, turned ``turn`` degrees."""
    if shape == "circle":
        k, start = 96, 0.0
    elif shape == "square":
        k, start, r = 4, 45.0, r * 1.25
    else:
        k, start, r = 3, -90.0, r * 1.15
        cy += r * 0.2  # centroid below the bounding box centre
    pts = []
    for i in range(k):
        a = math.radians(start + turn + 360.0 * i / k)
        pts.append((cx + r * math.cos(a), cy + r * math.sin(a)))
    return pts


def draw_one(rng: random.Random) -> Drawn:
    item = Item(rng.choice(("circle", "square", "triangle")),
                rng.choice(("red", "green", "blue", "yellow")))
    side = rng.choice(CANVAS)
    big = side * SUPER
    canvas = Image.new("RGB", (big, big), _backdrop(rng))
    pen = ImageDraw.Draw(canvas)
    r = rng.uniform(0.22, 0.40) * big
    room = big / 2 - r * 1.2
    cx = big / 2 + rng.uniform(-room, room) * 0.9
    cy = big / 2 + rng.uniform(-room, room) * 0.9
    turn = rng.uniform(-12.0, 12.0) if item.shape != "circle" else 0.0
    pts = _polygon(item.shape, cx, cy, r, turn)
    colour = _shade(rng, item.colour)
    outline = rng.random() < 0.5
    if outline:
        width = max(2, int(rng.uniform(0.05, 0.09) * big))
        pen.polygon(pts, outline=colour, width=width)
    else:
        pen.polygon(pts, fill=colour)
    img = canvas.resize((side, side), Image.Resampling.LANCZOS)
    noisy = rng.random() < 0.5
    if noisy:
        arr = np.asarray(img, dtype=np.float32)
        gen = np.random.default_rng(rng.randrange(2**32))
        noised = arr + gen.normal(0.0, rng.uniform(3.0, 10.0), arr.shape)
        img = Image.fromarray(np.clip(noised, 0, 255).astype(np.uint8))
    buf = io.BytesIO()
    jpeg = rng.random() < 0.5
    if jpeg:
        img.save(buf, format="JPEG", quality=rng.randint(35, 85))
    else:
        img.save(buf, format="PNG")
    return Drawn(buf.getvalue(), item, outline, noisy, jpeg)


def text_at(rng: random.Random, position: str, n: int) -> int:
    if position == "before":
        return 0
    if position == "after":
        return n
    return rng.randint(1, n - 1)


def _miss(got: Item | None, want: Item) -> str:
    """What was wrong with one image's answer: nothing, shape, colour, both, or not named."""
    if got is None:
        return "unnamed"
    bad_shape, bad_colour = got.shape != want.shape, got.colour != want.colour
    return {(False, False): "right", (True, False): "shape", (False, True): "colour"}.get(
        (bad_shape, bad_colour), "both")


def _rate(hits: list[bool]) -> float | None:
    return round(sum(hits) / len(hits), 4) if hits else None


def draws(requests: int, seed: int) -> Iterator[tuple[str, int, list[Drawn], int]]:
    """The held-out requests in order: (question position, image count, drawings, where the
    question stands); ``requests`` per position and count 1..8 ('between' needs 2+)."""
    for pi, position in enumerate(POSITIONS):
        for n in range(1, 9):
            if position == "between" and n == 1:
                continue
            rng = random.Random(seed * 7919 + pi * 101 + n)
            for _ in range(requests):
                drawn = [draw_one(rng) for _ in range(n)]
                yield position, n, drawn, text_at(rng, position, n)


def evaluate(model_dir: Path, requests: int, seed: int) -> dict[str, Any]:
    """``requests`` requests per (question position, image count 1..8); 'between' needs 2+."""
    ld = load(model_dir)
    per_image: dict[str, list[bool]] = {p: [] for p in POSITIONS}
    per_request: dict[str, list[bool]] = {p: [] for p in POSITIONS}
    by_count: dict[int, list[bool]] = {}
    by_style: dict[str, list[bool]] = {k: [] for k in
                                       ("filled", "outline", "noisy", "jpeg", "clean_png")}
    examples: dict[str, str] = {}
    misses = {"right": 0, "shape": 0, "colour": 0, "both": 0, "unnamed": 0}
    t0 = time.time()
    for position, n, drawn, at in draws(requests, seed):
        text = answer(ld, [d.png for d in drawn], QUESTION, text_at=at)
        got = parse_answer(text, n)
        ok = [g == d.item for g, d in zip(got, drawn)]
        for g, d in zip(got, drawn):
            misses[_miss(g, d.item)] += 1
        per_image[position] += ok
        per_request[position].append(all(ok))
        by_count.setdefault(n, []).extend(ok)
        for d, hit in zip(drawn, ok):
            by_style["outline" if d.outline else "filled"].append(hit)
            if d.noisy:
                by_style["noisy"].append(hit)
            if d.jpeg:
                by_style["jpeg"].append(hit)
            if not (d.noisy or d.jpeg):
                by_style["clean_png"].append(hit)
        examples.setdefault(f"{position}_{n}", text)
    all_img = [h for p in POSITIONS for h in per_image[p]]
    all_req = [h for p in POSITIONS for h in per_request[p]]
    return {
        "model": str(model_dir), "seed": seed, "requests_per_position_and_count": requests,
        "per_position": {p: {"per_image": _rate(per_image[p]), "per_request": _rate(per_request[p]),
                             "images": len(per_image[p]), "requests": len(per_request[p])}
                         for p in POSITIONS},
        "all": {"per_image": _rate(all_img), "per_request": _rate(all_req),
                "images": len(all_img), "requests": len(all_req)},
        "per_image_by_count": {str(n): _rate(v) for n, v in sorted(by_count.items())},
        "per_image_by_style": {k: _rate(v) for k, v in by_style.items()},
        "misses_by_kind": {k: v for k, v in misses.items() if k != "right"},
        "examples": {k: examples[k] for k in ("before_3", "between_3", "after_3") if k in examples},
        "eval_wall_s": round(time.time() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=str(ROOT / "models" / "tiny-qwen2vl"))
    p.add_argument("--requests", type=int, default=10, help="per question position and image count")
    p.add_argument("--seed", type=int, default=777)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="", help="also write the JSON here")
    p.add_argument("--samples", default="", help="also write 12 example drawings to this folder")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.samples:
        folder = Path(args.samples)
        folder.mkdir(parents=True, exist_ok=True)
        rng = random.Random(args.seed)
        for i in range(12):
            d = draw_one(rng)
            ext = "jpg" if d.jpeg else "png"
            (folder / f"{i:02d}-{d.item.colour}-{d.item.shape}.{ext}").write_bytes(d.png)
    if not has_model(args.model):
        return 2
    emit(evaluate(Path(args.model), args.requests, args.seed), args.out)
    return 0


def has_model(model: str) -> bool:
    """A checkpoint folder; says what is missing otherwise."""
    if (Path(model) / "config.json").is_file():
        return True
    print(f"error: {model} has no config.json", file=sys.stderr)
    return False


def emit(res: dict, out: str) -> None:
    """Print the result as JSON and, with ``out``, also write it there."""
    text = json.dumps(res, indent=2)
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
