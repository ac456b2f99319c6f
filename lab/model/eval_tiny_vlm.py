"""Held-out accuracy of a tiny Qwen2-VL folder, loaded and run the way the runtime does.

Per-image accuracy = colour AND shape right, read with :func:`epdctl.shapes.parse_answer`
from a one-process greedy ``generate()`` answer, on freshly generated requests (seeds
disjoint from training), for 1- and 8-image requests, varied and plainly drawn.
``--split-seeds`` scores instead the very requests ``benchmarks/accuracy_split.py`` (and the e2e
floor in tests/e2e/test_local_cluster.py) send through the split pipeline, whose tokens equal
one-process greedy generation: the served figure without starting a cluster.

    .venv/bin/python lab/model/eval_tiny_vlm.py [--model models/tiny-qwen2vl] [--requests 50]
        [--split-seeds]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))  # heldout_shapes, tiny_vlm_common
from tiny_vlm_common import answer, load  # noqa: E402

from epdctl import shapes  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SPLIT_SEED = 900_000  # benchmarks/accuracy_split.py --seed default (the e2e floor's seeds)


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


def split_requests(n: int, plain: bool, requests: int,
                   base: int = SPLIT_SEED) -> Iterator[tuple[list[bytes], str, list[shapes.Item]]]:
    """The requests accuracy_split.py sends for ``n`` images: canary seeds base + 10,000 n +
    plain + i (see :func:`epdctl.canary.request.measure_accuracy`)."""
    seed = base + 10_000 * n + plain
    for i in range(requests):
        yield shapes.make_request(random.Random(seed + i), n, plain=plain)


def evaluate_split_seeds(model_dir: Path, requests: int = 80,
                         counts: tuple[int, ...] = (1, 8)) -> dict[str, Any]:
    """accuracy_split.py's per-image figures (same requests, same token limit), in one process."""
    ld = load(model_dir)
    res: dict[str, Any] = {"model": str(model_dir), "requests_per_case": requests,
                           "seeds": f"accuracy_split.py --seed {SPLIT_SEED}"}
    for n in counts:
        for plain in (False, True):
            right = 0
            for pngs, q, items in split_requests(n, plain, requests):
                got = shapes.parse_answer(answer(ld, pngs, q, max_new_tokens=12 * n + 8), n)
                right += sum(g == it for g, it in zip(got, items))
            res[f"{n}_image{'_plain' if plain else '_varied'}"] = round(right / (n * requests), 4)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=str(ROOT / "models" / "tiny-qwen2vl"))
    p.add_argument("--requests", type=int, default=0,
                   help="requests per case (default 50; 80 with --split-seeds)")
    p.add_argument("--seed", type=int, default=4321)
    p.add_argument("--split-seeds", action="store_true",
                   help="score accuracy_split.py's requests (80 per case unless --requests)")
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    if not (Path(args.model) / "config.json").is_file():
        print(f"error: {args.model} has no config.json; train it with lab/model/train_tiny_vlm.py",
              file=sys.stderr)
        return 2
    if args.split_seeds:
        print(json.dumps(evaluate_split_seeds(Path(args.model), args.requests or 80), indent=2))
        return 0
    print(json.dumps(evaluate_folder(Path(args.model), args.requests or 50, args.seed), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
