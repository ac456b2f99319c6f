"""Where the tiny model's multi-image misses come from: reading a shape, or binding an answer
line to its image.

Draws held-out images with ``heldout_shapes.draw_one`` (not the training code) and scores the
same drawings three ways: each image alone; in 3-4-image requests whose images all share one
colour (the question before, between or after them); in 3-4-image requests of mixed colours.
Then, teacher-forced on the right answer of same-colour requests, it measures where the text
model looks: at the position that predicts line k's colour and the one that predicts its shape,
the share of each head's attention on image k's tokens and on the other images' tokens (the
head most focused on image k, per layer).

    .venv/bin/python lab/model/tiny_vlm_binding.py [--model models/tiny-qwen2vl] [--requests 100]
"""

from __future__ import annotations

import argparse
import io
import random
import sys
from pathlib import Path
from typing import Any

import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))  # heldout_shapes, tiny_vlm_common
from heldout_shapes import POSITIONS, ROOT, Drawn, draw_one, emit, has_model, text_at  # noqa: E402
from tiny_vlm_common import Loaded, answer, encode_request, load  # noqa: E402

from epdctl.shapes import QUESTION, answer_for, parse_answer  # noqa: E402


def request(rng: random.Random, same_colour: bool) -> list[Drawn]:
    """3 or 4 held-out drawings; with ``same_colour`` all of the first one's colour."""
    n, first = rng.choice((3, 4)), draw_one(rng)
    drawn = [first]
    while len(drawn) < n:
        d = draw_one(rng)
        if not same_colour or d.item.colour == first.item.colour:
            drawn.append(d)
    return drawn


def score(ld: Loaded, requests: int, seed: int) -> dict[str, Any]:
    """Per-image accuracy of the same drawings alone, in same-colour and in mixed requests."""
    out: dict[str, Any] = {}
    for name, same in (("same_colour", True), ("mixed_colour", False)):
        rng = random.Random(seed + same)
        alone: list[bool] = []
        together: list[bool] = []
        for _ in range(requests):
            drawn = request(rng, same)
            at = text_at(rng, rng.choice(POSITIONS), len(drawn))
            got = parse_answer(answer(ld, [d.png for d in drawn], QUESTION, text_at=at), len(drawn))
            together += [g == d.item for g, d in zip(got, drawn)]
            alone += [parse_answer(answer(ld, [d.png], QUESTION), 1)[0] == d.item for d in drawn]
        out[name] = {"images": len(alone), "alone": round(sum(alone) / len(alone), 4),
                     "in_request": round(sum(together) / len(together), 4)}
    return out


def attention(ld: Loaded, requests: int, seed: int) -> dict[str, Any]:
    """Per layer and answer position (colour / shape): the head most focused on image k, with
    its share on image k and on the other images, averaged over same-colour requests."""
    from transformers import Qwen2VLForConditionalGeneration

    model = Qwen2VLForConditionalGeneration.from_pretrained(
        ld.model.name_or_path, dtype=torch.float32, attn_implementation="eager").eval()
    tok, rng = ld.tokenizer, random.Random(seed + 7)
    sums: dict[tuple[str, int], list[torch.Tensor]] = {}
    for _ in range(requests):
        drawn = request(rng, True)
        images = [Image.open(io.BytesIO(d.png)).convert("RGB") for d in drawn]
        inputs = encode_request(ld, images, QUESTION)
        ans = tok(answer_for([d.item for d in drawn]), add_special_tokens=False)["input_ids"]
        start = inputs["input_ids"].shape[1]
        ids = torch.cat([inputs["input_ids"], torch.tensor([ans])], 1)
        inputs.update(input_ids=ids, attention_mask=torch.ones_like(ids),
                      mm_token_type_ids=(ids == ld.image_pad_id).int())
        with torch.no_grad():
            att = model(**inputs, output_attentions=True).attentions
        pads = (ids[0] == ld.image_pad_id).nonzero().flatten().tolist()
        per = len(pads) // len(drawn)
        groups = [pads[k * per:(k + 1) * per] for k in range(len(drawn))]
        colour = drawn[0].item.colour
        colour_at = [start + i for i, t in enumerate(ans) if colour in tok.decode([t])]
        for k, at in enumerate(colour_at[:len(drawn)]):
            for where, q in (("colour", at - 1), ("shape", at)):
                for layer, a in enumerate(att):
                    mass = torch.stack([a[0, :, q, g].sum(-1) for g in groups], -1)
                    own = mass[:, k]
                    sums.setdefault((where, layer), []).append(
                        torch.stack([own, mass.sum(-1) - own], -1))
    out: dict[str, Any] = {}
    for (where, layer), rows in sorted(sums.items()):
        mean = torch.stack(rows).mean(0)  # heads x (own, other)
        head = int(mean[:, 0].argmax())
        out.setdefault(where, {})[str(layer)] = {
            "head": head, "on_image_k": round(float(mean[head, 0]), 3),
            "on_other_images": round(float(mean[head, 1]), 3)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=str(ROOT / "models" / "tiny-qwen2vl"))
    p.add_argument("--requests", type=int, default=100, help="per kind of request")
    p.add_argument("--seed", type=int, default=4242)
    p.add_argument("--out", default="", help="also write the JSON here")
    args = p.parse_args(argv)
    if not has_model(args.model):
        return 2
    torch.set_num_threads(1)
    ld = load(args.model)
    emit({"model": args.model, "seed": args.seed, "requests": args.requests,
          "accuracy": score(ld, args.requests, args.seed),
          "attention": attention(ld, max(1, args.requests // 5), args.seed)}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
