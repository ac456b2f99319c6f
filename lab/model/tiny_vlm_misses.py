"""Where the tiny Qwen2-VL misses on the held-out drawings of ``scripts/heldout_shapes.py``.

Draws exactly the requests ``heldout_shapes.py`` scores for the same ``--requests``/``--seed``
(its own generator and RNG seeding, used here for evaluation only, never for training) and breaks
the per-image accuracy down the ways that tell what to train next: question position x image
count, shape x filled/outlined, and which shape a missed image was read as.

    PYTHONPATH=$PWD .venv/bin/python lab/model/tiny_vlm_misses.py [--model models/tiny-qwen2vl]
        [--requests 20] [--seed 777] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))  # heldout_shapes, tiny_vlm_common
from heldout_shapes import POSITIONS, draws, emit, has_model  # noqa: E402
from tiny_vlm_common import answer, load  # noqa: E402

from epdctl.shapes import QUESTION, Item, parse_answer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Read:
    """One scored image: where its request put the question, how many images, what was drawn,
    how, and what the model named (None: not named at all)."""
    position: str
    count: int
    want: Item
    outline: bool
    got: Item | None


def _rate(hits: list[bool]) -> float | None:
    return round(sum(hits) / len(hits), 4) if hits else None


def collect(model_dir: Path, requests: int, seed: int) -> list[Read]:
    """Answer the held-out requests (same draw as ``heldout_shapes.evaluate``) and record each
    image's reading."""
    ld = load(model_dir)
    reads: list[Read] = []
    for position, n, drawn, at in draws(requests, seed):
        got = parse_answer(answer(ld, [d.png for d in drawn], QUESTION, text_at=at), n)
        reads += [Read(position, n, d.item, d.outline, g) for g, d in zip(got, drawn)]
    return reads


def tally(reads: list[Read]) -> dict[str, Any]:
    """Per-image accuracy overall, by position x count, by shape x style; shape confusions."""
    by_cell: dict[str, dict[str, list[bool]]] = {p: {} for p in POSITIONS}
    by_style: dict[str, list[bool]] = {}
    confusions: Counter[str] = Counter()
    for r in reads:
        ok = r.got == r.want
        by_cell[r.position].setdefault(str(r.count), []).append(ok)
        style = f"{r.want.shape} {'outlined' if r.outline else 'filled'}"
        by_style.setdefault(style, []).append(ok)
        if not ok:
            read_as = "unnamed" if r.got is None else (
                r.got.shape if r.got.colour == r.want.colour else f"{r.got.colour} {r.got.shape}")
            confusions[f"{style} -> {read_as}"] += 1
    return {
        "per_image": _rate([r.got == r.want for r in reads]),
        "images": len(reads),
        "by_position_and_count": {p: {n: _rate(v) for n, v in cells.items()}
                                  for p, cells in by_cell.items()},
        "by_shape_and_style": {k: _rate(v) for k, v in sorted(by_style.items())},
        "confusions": dict(confusions.most_common()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=str(ROOT / "models" / "tiny-qwen2vl"))
    p.add_argument("--requests", type=int, default=20, help="per question position and count")
    p.add_argument("--seed", type=int, default=777)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="", help="also write the JSON here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not has_model(args.model):
        return 2
    emit({"model": args.model, "seed": args.seed, "requests_per_position_and_count": args.requests,
          **tally(collect(Path(args.model), args.requests, args.seed))}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
