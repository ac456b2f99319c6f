"""Training data of the tiny Qwen2-VL: generated requests encoded into batches, the image-count
curriculum, and teacher-forced per-image accuracy (the quick check ``train_tiny_vlm.py`` logs).
"""

from __future__ import annotations

import argparse
import random
from typing import Any

import torch

from tiny_vlm_common import IMAGE_PAD, expand_pads, messages_for
from tiny_vlm_styles import question_at, styled_item

from epdctl import shapes


class Batcher:
    """Encodes generated requests into padded training batches (loss on the answer only)."""

    def __init__(self, tok: Any, proc: Any) -> None:
        self.tok, self.proc = tok, proc
        self.pad_id = tok.convert_tokens_to_ids("<|endoftext|>")
        self.image_pad_id = tok.convert_tokens_to_ids(IMAGE_PAD)
        self._prompts: dict[tuple[int, int], list[int]] = {}
        self.side = int(proc.size.shortest_edge ** 0.5 + 0.5)

    def prompt_ids(self, n: int, text_at: int | None = None) -> list[int]:
        """Prompt tokens for ``n`` images with the question before image ``text_at`` (default
        after them all)."""
        key = (n, n if text_at is None else text_at)
        if key not in self._prompts:
            text = self.tok.apply_chat_template(messages_for(n, shapes.question(), key[1]),
                                                add_generation_prompt=True, tokenize=False)
            g = self.side // 14
            grid = torch.tensor([[1, g, g]] * n)
            text = expand_pads(text, grid)
            self._prompts[key] = self.tok(text, add_special_tokens=False)["input_ids"]
        return self._prompts[key]

    def batch(self, rng: random.Random, counts: list[int], plain_frac: float = 0.0,
              style_frac: float = 0.0, question_mix: float = 0.0,
              shared_colour: float = 0.0) -> dict[str, Any]:
        """``style_frac`` of the images come from :func:`tiny_vlm_styles.styled_item`; with
        probability ``question_mix`` a request's question stands before or between the images;
        with probability ``shared_colour`` a request of 2+ images draws all its colours from one
        or two (see :func:`palette`). At 0 none draws from ``rng``, so the earlier stages
        reproduce bit for bit."""
        seqs, labels, images, all_items = [], [], [], []
        for n in counts:
            items = []
            colours = palette(rng, n, shared_colour)
            for _ in range(n):
                colour = rng.choice(colours) if colours else None
                if style_frac and rng.random() < style_frac:
                    img, item = styled_item(rng, colour)
                else:
                    img, item = shapes.random_item(rng, plain=rng.random() < plain_frac,
                                                   colour=colour)
                images.append(img)
                items.append(item)
            all_items.append(items)
            p = self.prompt_ids(n, question_at(rng, n, question_mix))
            a = self.tok(shapes.answer_for(items) + "<|im_end|>", add_special_tokens=False)["input_ids"]
            seqs.append(p + a)
            labels.append([-100] * len(p) + a)
        pix = self.proc(images=images, return_tensors="pt")
        if int(pix["image_grid_thw"].prod(-1).sum()) != (self.side // 14) ** 2 * len(images):
            raise RuntimeError(f"image processor did not resize every image to {self.side}px")
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id)
        lab = torch.full((len(seqs), width), -100)
        att = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, (s, l) in enumerate(zip(seqs, labels)):
            ids[i, :len(s)] = torch.tensor(s)
            lab[i, :len(l)] = torch.tensor(l)
            att[i, :len(s)] = 1
        return {"input_ids": ids, "labels": lab, "attention_mask": att,
                "mm_token_type_ids": (ids == self.image_pad_id).int(),
                "pixel_values": pix["pixel_values"], "image_grid_thw": pix["image_grid_thw"],
                "items": all_items}


def palette(rng: random.Random, n: int, shared: float) -> list[str]:
    """The colours a request of ``n`` images may use: all (``[]``) unless, with probability
    ``shared``, one or two of them, so that images share a colour and differ in shape. The
    model then cannot find "Picture k"'s shape by its colour (the shortcut behind most misses
    on held-out drawings: the shape of another image of the same colour) and must bind each
    answer line to its image. Draws nothing from ``rng`` when ``shared`` is 0."""
    if not shared or n < 2 or rng.random() >= shared:
        return []
    return rng.sample(list(shapes.COLOURS), rng.choice((1, 2)))


def teacher_forced_accuracy(model: Any, tok: Any, b: dict[str, Any]) -> list[list[bool]]:
    """Per image: are the colour and shape tokens both argmax given the right prefix?"""
    with torch.no_grad():
        logits = model(**{k: v for k, v in b.items() if k not in ("labels", "items")}).logits
    pred = logits[:, :-1].argmax(-1)
    tgt = b["labels"][:, 1:]
    nl = tok("\n", add_special_tokens=False)["input_ids"]
    out = []
    for i, items in enumerate(b["items"]):
        ok_tok = (pred[i] == tgt[i]) | (tgt[i] == -100)
        pos = (tgt[i] != -100).nonzero().flatten().tolist()
        # Split answer positions into one run per line ("\n" tokens separate images).
        runs, cur = [], []
        for p in pos:
            cur.append(p)
            if tgt[i, p].item() in nl:
                runs.append(cur)
                cur = []
        runs.append(cur)
        out.append([bool(ok_tok[r].all()) for r in runs[:len(items)]])
    return out


def count_for(rng: random.Random, step: int, args: argparse.Namespace) -> int:
    """Curriculum: single images for ``--single-steps`` (shape features first), then the
    largest image count grows from 3 to 8 over ``--ramp`` steps."""
    if step <= args.single_steps:
        return 1
    step -= args.single_steps
    if args.many_frac and rng.random() < args.many_frac:
        return rng.randint(5, 8)
    top = min(8, 3 + (5 * step) // max(1, args.ramp))
    return rng.randint(1, top)


def evaluate_tf(model: Any, tok: Any, batcher: Batcher, seed: int, per: int = 24,
                styled: bool = False) -> dict[str, float]:
    """Teacher-forced per-image accuracy; ``styled`` adds "4s"/"8s": styled images with the
    question anywhere."""
    model.eval()
    res = {}
    cases = [(n, plain, False) for n in (1, 2, 4, 8) for plain in (False, True)]
    if styled:
        cases += [(4, False, True), (8, False, True)]
    for n, plain, sty in cases:
        rng = random.Random(seed * 100 + n * 2 + plain + 50 * sty)
        b = batcher.batch(rng, [n] * per, plain_frac=1.0 if plain else 0.0,
                          style_frac=1.0 if sty else 0.0, question_mix=1.0 if sty else 0.0)
        acc = teacher_forced_accuracy(model, tok, b)
        flat = [x for r in acc for x in r]
        res[f"{n}{'p' if plain else ''}{'s' if sty else ''}"] = sum(flat) / len(flat)
    model.train()
    return res
