"""Build the offline tokenizer and train the tiny Qwen2-VL in ``models/tiny-qwen2vl/``.

Everything is made here, offline and deterministically: a byte-level BPE tokenizer trained
on generated prompt/answer text (Qwen special tokens, a Qwen2-VL-style chat template that
marks images "Picture k:"), a small ``Qwen2VLForConditionalGeneration``, and training on
generated requests from :mod:`epdctl.shapes`.

Recipe (why): shape is the hard feature and only emerges from clean single-image gradients,
so the first ``--single-steps`` steps use single-image requests (batch 32); then requests of
1..N images with N growing 3 -> 8 over ``--ramp`` steps teach the "Picture k" binding. Images
are resized to 56x56 (4 tokens each) to keep 8-image steps cheap. Constant LR after warm-up,
so a run stopped early by ``--time-limit`` is reproduced exactly by ``--steps N``.
The folder is saved atomically every ``--save-every`` steps, so a run cut short still leaves a
usable model; ``training_report.json`` records steps, wall/CPU time and held-out accuracy.

    .venv/bin/python scripts/train_tiny_vlm.py --steps 3000
    .venv/bin/python scripts/train_tiny_vlm.py --eval-only
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_vlm_common import IMAGE_PAD, expand_pads, messages_for  # noqa: E402
from tiny_vlm_styles import question_at, styled_item  # noqa: E402

from epdctl import shapes  # noqa: E402

log = logging.getLogger("train_tiny_vlm")
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "models" / "tiny-qwen2vl"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
            "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# Every square image becomes 56x56 -> 2x2 merged tokens = 4 pads. max is a little above
# 56*56 because smart_resize's float rounding would shrink some sizes (96 px) to 28x28.
MIN_PIXELS, MAX_PIXELS = 56 * 56, 4000
SIDE_PIXELS = {56: (MIN_PIXELS, MAX_PIXELS), 112: (112 * 112, 112 * 112 + 1500)}
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] in ['image', 'image_url'] or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "Picture {{ image_count.value }}: <|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# ---------------------------------------------------------------- tokenizer
def _corpus(rng: random.Random, n: int) -> list[str]:
    """Text the BPE merges are learned from: prompts, answers, a little plain English."""
    lines = []
    for _ in range(n):
        k = rng.randint(1, 8)
        items = [shapes.Item(rng.choice(shapes.SHAPES), rng.choice(list(shapes.COLOURS)))
                 for _ in range(k)]
        lines.append("user\n" + "".join(f"Picture {i}: " for i in range(1, k + 1))
                     + shapes.question() + "\nassistant\n" + shapes.answer_for(items) + "\n")
    lines += ["You are a helpful assistant.", "Describe the image.", "What colour is it?",
              "What shape is this? How many images are there?"] * 20
    return lines


def build_tokenizer(vocab_size: int = 384) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` with Qwen's special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(random.Random(7), 4000), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        unk_token=None, additional_special_tokens=SPECIALS[1:],
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 4096
    return fast


# -------------------------------------------------------------------- model
def build_model(tok: Any, args: argparse.Namespace) -> Any:
    """A tiny Qwen2-VL whose token ids all live in ``tok``'s small vocabulary."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIALS}
    hidden, heads = args.hidden, 4
    head_dim = hidden // heads
    q = head_dim // 2
    mrope = [q - 2 * (3 * q // 8), 3 * q // 8, 3 * q // 8]
    cfg = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden,
            num_hidden_layers=args.layers, num_attention_heads=heads, num_key_value_heads=2,
            max_position_embeddings=4096, rope_parameters={
                "rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope},
            bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|endoftext|>"],
        ),
        vision_config=dict(depth=2, embed_dim=args.vision_embed, hidden_size=hidden,
                           num_heads=4, mlp_ratio=2, patch_size=14, temporal_patch_size=2,
                           spatial_merge_size=2),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    torch.manual_seed(args.seed)
    model = Qwen2VLForConditionalGeneration(cfg)
    gc = model.generation_config
    gc.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    gc.pad_token_id = ids["<|endoftext|>"]
    gc.bos_token_id = ids["<|endoftext|>"]
    gc.do_sample = False
    gc.max_new_tokens = 80
    return model


def make_image_processor(side: int = 56) -> Any:
    """Every square image is resized to ``side`` px: (side/28)^2 merged tokens."""
    from transformers import Qwen2VLImageProcessorPil

    lo, hi = SIDE_PIXELS[side]
    return Qwen2VLImageProcessorPil(min_pixels=lo, max_pixels=hi)


def _pin_image_processor(path: Path) -> None:
    """Name the PIL processor explicitly (no torchvision) and spell out min/max pixels."""
    cfg = json.loads(path.read_text())
    cfg["image_processor_type"] = "Qwen2VLImageProcessorPil"
    cfg["min_pixels"], cfg["max_pixels"] = cfg["size"]["shortest_edge"], cfg["size"]["longest_edge"]
    path.write_text(json.dumps(cfg, indent=2) + "\n")


def save(model: Any, tok: Any, proc: Any, out: Path, report: dict[str, Any] | None) -> None:
    """Write the whole folder to a sibling temp dir, then swap it in (readers never see half)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    tok.save_pretrained(str(tmp))
    proc.save_pretrained(str(tmp))
    _pin_image_processor(tmp / "preprocessor_config.json")
    if report is not None:
        (tmp / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------- data
class Batcher:
    """Encodes generated requests into padded training batches (loss on the answer only)."""

    def __init__(self, tok: Any, proc: Any) -> None:
        self.tok, self.proc = tok, proc
        self.pad_id = tok.convert_tokens_to_ids("<|endoftext|>")
        self.image_pad_id = tok.convert_tokens_to_ids(IMAGE_PAD)
        self._prompts: dict[int, list[int]] = {}
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
              style_frac: float = 0.0, question_mix: float = 0.0) -> dict[str, Any]:
        """``style_frac`` of the images come from :func:`tiny_vlm_styles.styled_item`; with
        probability ``question_mix`` a request's question stands before or between the images.
        At 0 neither draws from ``rng``, so the earlier stages reproduce bit for bit."""
        seqs, labels, images, all_items = [], [], [], []
        for n in counts:
            items = []
            for _ in range(n):
                if style_frac and rng.random() < style_frac:
                    img, item = styled_item(rng)
                else:
                    img, item = shapes.random_item(rng, plain=rng.random() < plain_frac)
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


# -------------------------------------------------------------------- train
def load_init(model: Any, tok: Any, folder: Path) -> dict[str, Any]:
    """Start from an earlier checkpoint (same architecture and tokenizer); returns its report."""
    from transformers import Qwen2VLForConditionalGeneration

    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    if vocab != tok.get_vocab() and len(vocab) + len(SPECIALS) != len(tok):
        raise RuntimeError(f"{folder}: tokenizer differs from the one this script builds")
    done = Qwen2VLForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32)
    model.load_state_dict(done.state_dict())  # strict: same architecture or a clear error
    log.info("initialised from %s", folder)
    return json.loads((folder / "training_report.json").read_text())


def command_for(args: argparse.Namespace, step: int) -> str:
    """The command line that reproduces this checkpoint (non-default training options only)."""
    defaults = vars(parse_args([]))
    skip = {"steps", "out", "eval_only", "time_limit", "log_every", "eval_every", "save_every",
            "eval_requests", "no_final_eval"}
    parts = [".venv/bin/python scripts/train_tiny_vlm.py", f"--steps {step}"]
    for k, v in vars(args).items():
        if k not in skip and v != defaults[k]:
            parts.append(f"--{k.replace('_', '-')} {v}")
    return " ".join(parts)


def count_for(rng: random.Random, step: int, args: argparse.Namespace) -> int:
    """Curriculum: single images for ``--single-steps`` (shape features first), then the
    largest image count grows from 3 to 8 over ``--ramp`` steps."""
    if step <= args.single_steps:
        return 1
    step -= args.single_steps
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


def train(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    tok = build_tokenizer()
    proc = make_image_processor(args.image_side)
    model = build_model(tok, args)
    init_report = None
    if args.init_from:
        init_report = load_init(model, tok, Path(args.init_from))
    nparams = sum(p.numel() for p in model.parameters())
    log.info("vocab %d, parameters %d", len(tok), nparams)
    out = Path(args.out)
    recipe = {k: v for k, v in vars(args).items() if k not in ("out", "eval_only")}
    if args.steps == 0:
        save(model, tok, proc, out, {"steps": 0, "note": "random init", "parameters": nparams,
                                     "recipe": recipe})
        log.info("saved random-init checkpoint to %s", out)
        return
    batcher = Batcher(tok, proc)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.98))
    rng = random.Random(args.seed)
    t0, c0 = time.time(), time.process_time()
    model.train()
    history: list[dict[str, Any]] = []
    ema = None
    step = 0
    for step in range(1, args.steps + 1):
        lr = args.lr * min(1.0, step / args.warmup)
        if args.anneal_steps:
            frac = min(step, args.anneal_steps) / args.anneal_steps
            lr *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))
        if args.decay_from and step > args.decay_from * args.steps:
            frac = (step - args.decay_from * args.steps) / ((1 - args.decay_from) * args.steps)
            lr *= 0.5 * (1 + math.cos(math.pi * frac)) * 0.9 + 0.1
        for g in opt.param_groups:
            g["lr"] = lr
        single = step <= args.single_steps
        counts = [count_for(rng, step, args) for _ in range(args.batch * (2 if single else 1))]
        b = batcher.batch(rng, counts, plain_frac=0.15, style_frac=args.style_frac,
                          question_mix=args.question_mix)
        loss = model(**{k: v for k, v in b.items() if k != "items"}).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step % args.log_every == 0:
            log.info("step %d loss %.4f lr %.2e wall %.0fs cpu %.0fs", step, ema, lr,
                     time.time() - t0, time.process_time() - c0)
        last = step == args.steps or (args.time_limit and time.time() - t0 > args.time_limit)
        if step % args.eval_every == 0 or last:
            acc = evaluate_tf(model, tok, batcher, seed=1000 + step,
                              styled=bool(args.style_frac or args.question_mix))
            history.append({"step": step, "loss": ema, "wall_s": time.time() - t0, "acc": acc})
            log.info("step %d held-out teacher-forced per-image acc %s", step,
                     " ".join(f"{k}={v:.3f}" for k, v in acc.items()))
        if step % args.save_every == 0 or last:
            report = {"steps": step, "steps_planned": args.steps, "wall_s": time.time() - t0,
                      "cpu_s": time.process_time() - c0, "threads": args.threads,
                      "parameters": nparams,
                      "recipe": recipe, "history": history,
                      "command": command_for(args, step), "init_from_report": init_report}
            save(model, tok, proc, out, report)
            log.info("saved step %d to %s", step, out)
        if last:
            break
    if not args.no_final_eval:
        from eval_tiny_vlm import evaluate_folder

        final = evaluate_folder(out, requests=args.eval_requests, seed=args.seed + 99)
        rep_path = out / "training_report.json"
        rep = json.loads(rep_path.read_text())
        rep["held_out"] = final
        rep["total_wall_s_with_eval"] = time.time() - t0
        rep_path.write_text(json.dumps(rep, indent=2) + "\n")
        log.info("final held-out generate() accuracy: %s", json.dumps(final))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=3000, help="optimizer steps (0: random init)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="checkpoint folder")
    p.add_argument("--eval-only", action="store_true", help="evaluate the saved folder, no training")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--batch", type=int, default=16, help="requests per step")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--decay-from", type=float, default=0.0,
                   help="fraction of --steps after which LR decays (cosine to 10%%); 0 = constant, "
                        "so a run stopped early by --time-limit is reproduced by --steps N")
    p.add_argument("--ramp", type=int, default=400, help="steps to grow the image count 3 -> 8")
    p.add_argument("--single-steps", type=int, default=700,
                   help="first steps with single-image requests only (batch doubled)")
    p.add_argument("--image-side", type=int, default=56, choices=sorted(SIDE_PIXELS),
                   help="images are resized to this square side (56: 4 tokens, 112: 16)")
    p.add_argument("--init-from", default="",
                   help="start from the weights of this checkpoint folder (second stage)")
    p.add_argument("--anneal-steps", type=int, default=0,
                   help="cosine LR from --lr to 10%% over this many steps (by step number only, "
                        "so stopping early is still reproducible); 0 = none")
    p.add_argument("--style-frac", type=float, default=0.0,
                   help="fraction of images drawn in random styles (outline, size, shade, noise, "
                        "JPEG: scripts/tiny_vlm_styles.py); 0 = the shapes module's drawings only")
    p.add_argument("--question-mix", type=float, default=0.0,
                   help="fraction of requests whose question stands before or between the images")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--layers", type=int, default=4, help="text layers")
    p.add_argument("--hidden", type=int, default=128, help="text hidden size")
    p.add_argument("--vision-embed", type=int, default=128)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--save-every", type=int, default=200)
    p.add_argument("--time-limit", type=float, default=0.0,
                   help="stop (and save) after this many wall seconds; 0 = no limit")
    p.add_argument("--eval-requests", type=int, default=50, help="held-out requests per case")
    p.add_argument("--no-final-eval", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    args = parse_args(argv)
    if args.eval_only:
        from eval_tiny_vlm import evaluate_folder

        torch.set_num_threads(2)
        print(json.dumps(evaluate_folder(Path(args.out), requests=args.eval_requests,
                                         seed=args.seed + 99), indent=2))
        return 0
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
