"""Held-out accuracy of the served model THROUGH the split pipeline (router -> prefill -> encoders,
KV -> decode), not in one process: per-image (colour and shape both right) and per-request.

    .venv/bin/epdctl up topologies/local.yaml --no-canary
    .venv/bin/python benchmarks/accuracy_split.py --router http://127.0.0.1:31006 --requests 100
    .venv/bin/epdctl down local

Seeds are fixed (base seed + request index) and decoding is greedy, so a run is repeatable;
none of these seeds is used in training (lab/model/train_tiny_vlm.py draws from its own seeds).
Writes benchmarks/results/accuracy_split.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from epdctl.canary import measure_accuracy  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--router", default="http://127.0.0.1:31006")
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--seed", type=int, default=900_000)
    ap.add_argument("--out", default="benchmarks/results/accuracy_split.json")
    args = ap.parse_args()
    rows = []
    for n in (1, 8):
        for plain in (False, True):
            seed = args.seed + 10_000 * n + plain
            acc = measure_accuracy(args.router, n_images=n, requests=args.requests, seed=seed,
                                   plain=plain)
            rows.append({"images_per_request": n, "plain": plain, "requests": acc.requests,
                         "images": acc.requests * n, "per_image_accuracy": acc.per_image,
                         "request_accuracy": acc.per_request, "seed": seed,
                         "seconds": round(acc.seconds, 1)})
            print(f"{n} image(s), {'plain ' if plain else 'varied'}: per-image "
                  f"{acc.per_image:.3f} over {acc.requests * n} images, per-request "
                  f"{acc.per_request:.3f} ({acc.seconds:.1f} s)", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"router": args.router, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
