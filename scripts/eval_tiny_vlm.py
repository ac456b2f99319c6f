"""Held-out accuracy of a tiny Qwen2-VL folder, loaded and run the way the runtime does.

Per-image accuracy = colour AND shape right, read with :func:`epdctl.shapes.parse_answer`
from a one-process greedy ``generate()`` answer, on freshly generated requests (seeds
disjoint from training), for 1- and 8-image requests, varied and plainly drawn.

    .venv/bin/python scripts/eval_tiny_vlm.py [--model models/tiny-qwen2vl] [--requests 50]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_vlm_common import answer, load  # noqa: E402

from epdctl import shapes  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def evaluate_folder(model_dir: Path, requests: int = 50, seed: int = 4321,
                    counts: tuple[int, ...] = (1, 8)) -> dict[str, Any]:
    """Per-image accuracy for each (count, plain) case, plus an example answer."""
    ld = load(model_dir)
    res: dict[str, Any] = {"model": str(model_dir), "requests_per_case": requests, "seed": seed}
    t0 = time.time()
    for n in counts:
        for plain in (False, True):
            rng = random.Random(seed * 1000 + n * 10 + plain)
            right = total = whole = 0
            example = ""
            for _ in range(requests):
                pngs, q, items = shapes.make_request(rng, n, plain=plain)
                text = answer(ld, pngs, q)
                got = shapes.parse_answer(text, n)
                ok = [g == it for g, it in zip(got, items)]
                right += sum(ok)
                total += n
                whole += all(ok)
                example = example or text
            key = f"{n}_image{'_plain' if plain else '_varied'}"
            res[key] = {"per_image_accuracy": right / total, "request_accuracy": whole / requests,
                        "images": total, "example": example}
    res["eval_wall_s"] = time.time() - t0
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=str(ROOT / "models" / "tiny-qwen2vl"))
    p.add_argument("--requests", type=int, default=50)
    p.add_argument("--seed", type=int, default=4321)
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    if not (Path(args.model) / "config.json").is_file():
        print(f"error: {args.model} has no config.json; train it with scripts/train_tiny_vlm.py",
              file=sys.stderr)
        return 2
    print(json.dumps(evaluate_folder(Path(args.model), args.requests, args.seed), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
