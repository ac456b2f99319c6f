"""Tokenizer, model and checkpoint folder of the tiny Qwen2-VL (what ``train_tiny_vlm.py`` trains).

A byte-level BPE tokenizer learned offline from generated prompt/answer text (Qwen special
tokens, a Qwen2-VL-style chat template that marks images "Picture k:"), a small
``Qwen2VLForConditionalGeneration`` whose token ids all live in that vocabulary, the PIL image
processor that resizes every image to one square side, and an atomic save/load of the folder.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from epdctl import shapes

log = logging.getLogger("train_tiny_vlm")

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
    cfg = Qwen2VLConfig(  # type: ignore[call-arg]
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


def load_init(model: Any, tok: Any, folder: Path) -> dict[str, Any]:
    """Start from an earlier checkpoint (same architecture and tokenizer); returns its report."""
    from transformers import Qwen2VLForConditionalGeneration

    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    if vocab != tok.get_vocab() and len(vocab) + len(SPECIALS) != len(tok):
        raise RuntimeError(f"{folder}: tokenizer differs from the one this script builds")
    done: Any = Qwen2VLForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32)
    state = done.state_dict()
    have, want = done.config.text_config.num_hidden_layers, model.config.text_config.num_hidden_layers
    if want > have:
        state = grown_state(state, have, want)
        log.info("grew the text model from %d to %d layers (new layers start as identity)",
                 have, want)
    model.load_state_dict(state)  # strict: same architecture or a clear error
    log.info("initialised from %s", folder)
    return json.loads((folder / "training_report.json").read_text())


LAYER_KEY = re.compile(r"^(.*\blayers\.)(\d+)(\..*)$")
ZEROED = (".self_attn.o_proj.weight", ".mlp.down_proj.weight")


def grown_state(state: dict[str, torch.Tensor], have: int, want: int) -> dict[str, torch.Tensor]:
    """Text-model weights for ``want`` layers from a ``have``-layer checkpoint, computing the
    same function: each new layer copies the old layer it follows (spread evenly) with its
    attention output and MLP down projections zeroed, so it adds nothing to the residual stream
    until training moves it."""
    extra = want - have
    after = [(k + 1) * have // extra - 1 for k in range(extra)]
    order: list[tuple[int, bool]] = []  # (old layer, is a new copy)
    for i in range(have):
        order.append((i, False))
        order += [(i, True)] * after.count(i)
    out: dict[str, torch.Tensor] = {}
    layers: dict[int, dict[str, tuple[str, str, torch.Tensor]]] = {}
    for key, val in state.items():
        m = LAYER_KEY.match(key)
        if m is None or "visual" in key:
            out[key] = val
        else:
            layers.setdefault(int(m.group(2)), {})[m.group(3)] = (m.group(1), m.group(3), val)
    for j, (i, copy) in enumerate(order):
        for prefix, rest, val in layers[i].values():
            out[f"{prefix}{j}{rest}"] = (torch.zeros_like(val) if copy and rest in ZEROED
                                         else val.clone())
    return out
