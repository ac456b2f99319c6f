"""Build the offline tokenizer and train the tiny Qwen2-VL in ``models/tiny-qwen2vl/``.

Everything is made offline and deterministically: the tokenizer and model by
``tiny_vlm_build.py``, the training requests (from :mod:`epdctl.shapes`, optionally drawn in
other styles by ``tiny_vlm_styles.py``) by ``tiny_vlm_data.py``; this file is the loop.

Recipe (why): shape is the hard feature and only emerges from clean single-image gradients,
so the first ``--single-steps`` steps use single-image requests (batch 32); then requests of
1..N images with N growing 3 -> 8 over ``--ramp`` steps teach the "Picture k" binding. Images
are resized to 56x56 (4 tokens each) to keep 8-image steps cheap. Constant LR after warm-up,
so a run stopped early by ``--time-limit`` is reproduced exactly by ``--steps N``.
The folder is saved atomically every ``--save-every`` steps, so a run cut short still leaves a
usable model; ``training_report.json`` records steps, wall/CPU time and held-out accuracy.

    .venv/bin/python lab/model/train_tiny_vlm.py --steps 3000
    .venv/bin/python lab/model/train_tiny_vlm.py --eval-only
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))  # heldout_shapes, tiny_vlm_common
from tiny_vlm_build import (SIDE_PIXELS, build_model, build_tokenizer,  # noqa: E402
                            load_init, make_image_processor, save)
from tiny_vlm_data import Batcher, count_for, evaluate_tf  # noqa: E402

log = logging.getLogger("train_tiny_vlm")
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "models" / "tiny-qwen2vl"


def command_for(args: argparse.Namespace, step: int) -> str:
    """The command line that reproduces this checkpoint (non-default training options only)."""
    defaults = vars(parse_args([]))
    skip = {"steps", "out", "eval_only", "time_limit", "log_every", "eval_every", "save_every",
            "eval_requests", "no_final_eval"}
    parts = [".venv/bin/python lab/model/train_tiny_vlm.py", f"--steps {step}"]
    for k, v in vars(args).items():
        if k not in skip and v != defaults[k]:
            parts.append(f"--{k.replace('_', '-')} {v}")
    return " ".join(parts)


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
                          question_mix=args.question_mix, shared_colour=args.shared_colour)
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
                        "JPEG: lab/model/tiny_vlm_styles.py); 0 = the shapes module's drawings only")
    p.add_argument("--question-mix", type=float, default=0.0,
                   help="fraction of requests whose question stands before or between the images")
    p.add_argument("--shared-colour", type=float, default=0.0,
                   help="fraction of requests whose images share one or two colours (the model "
                        "must bind each answer line to its image, not find it by colour)")
    p.add_argument("--many-frac", type=float, default=0.0,
                   help="fraction of requests with 5-8 images (the rest 1..N as --ramp says)")
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
