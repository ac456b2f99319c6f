"""Shared pieces of the tiny Qwen2-VL scripts: the generic loader and request encoding.

The loader does exactly what the runtime does with a model folder (``AutoTokenizer`` +
chat template, the image processor named by ``preprocessor_config.json``,
``Qwen2VLForConditionalGeneration``, one ``<|image_pad|>`` expanded to t*h*w/4 tokens), so
the accuracy the scripts report is the accuracy the served model has.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

IMAGE_PAD = "<|image_pad|>"


@dataclass
class Loaded:
    """A checkpoint folder loaded the generic way."""

    tokenizer: Any
    image_processor: Any
    model: Any
    image_pad_id: int
    im_end_id: int
    pad_id: int


def load_image_processor(model_dir: str | Path) -> Any:
    """The processor class ``preprocessor_config.json`` names (never a torchvision one)."""
    from transformers import AutoImageProcessor

    proc = AutoImageProcessor.from_pretrained(str(model_dir))
    if type(proc).__name__ != "Qwen2VLImageProcessorPil":
        raise ValueError(f"{model_dir}: expected Qwen2VLImageProcessorPil, got {type(proc).__name__}")
    return proc


def load(model_dir: str | Path) -> Loaded:
    """Load tokenizer, image processor and model from ``model_dir`` (eval mode, fp32)."""
    from transformers import AutoTokenizer, Qwen2VLForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    proc = load_image_processor(model_dir)
    model = Qwen2VLForConditionalGeneration.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    return Loaded(
        tokenizer=tok,
        image_processor=proc,
        model=model,
        image_pad_id=tok.convert_tokens_to_ids(IMAGE_PAD),
        im_end_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_id=tok.convert_tokens_to_ids("<|endoftext|>"),
    )


def messages_for(n_images: int, text: str, text_at: int | None = None) -> list[dict[str, Any]]:
    """OpenAI-style chat messages: ``n_images`` image parts with the question inserted before
    image ``text_at`` (0: before all images; ``None`` or ``n_images``: after them, the default)."""
    parts: list[dict[str, Any]] = [{"type": "image"} for _ in range(n_images)]
    at = n_images if text_at is None else text_at
    if not 0 <= at <= n_images:
        raise ValueError(f"text_at={text_at} is outside 0..{n_images}")
    parts.insert(at, {"type": "text", "text": text})
    return [{"role": "user", "content": parts}]


def expand_pads(prompt: str, grid_thw: torch.Tensor, merge: int = 2) -> str:
    """Replace the k-th ``<|image_pad|>`` by t*h*w/merge^2 pads, as Qwen2VLProcessor does."""
    pieces = prompt.split(IMAGE_PAD)
    if len(pieces) - 1 != len(grid_thw):
        raise ValueError(f"prompt has {len(pieces) - 1} image pads but {len(grid_thw)} images")
    out = [pieces[0]]
    for k, rest in enumerate(pieces[1:]):
        n = int(grid_thw[k].prod()) // (merge * merge)
        out.append(IMAGE_PAD * n)
        out.append(rest)
    return "".join(out)


def encode_request(ld: Loaded, images: list[Image.Image], text: str,
                   text_at: int | None = None) -> dict[str, torch.Tensor]:
    """Model inputs for one request, built the way the runtime builds them."""
    prompt = ld.tokenizer.apply_chat_template(
        messages_for(len(images), text, text_at), add_generation_prompt=True, tokenize=False
    )
    pix = ld.image_processor(images=images, return_tensors="pt")
    grid = pix["image_grid_thw"]
    prompt = expand_pads(prompt, grid, ld.image_processor.merge_size)
    ids = torch.tensor([ld.tokenizer(prompt, add_special_tokens=False)["input_ids"]])
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "mm_token_type_ids": (ids == ld.image_pad_id).int(),
        "pixel_values": pix["pixel_values"],
        "image_grid_thw": grid,
    }


def answer(ld: Loaded, pngs: list[bytes], text: str, max_new_tokens: int = 80,
           text_at: int | None = None) -> str:
    """Greedy one-process ``generate()`` for one request of encoded images (PNG, JPEG...)."""
    images = [Image.open(io.BytesIO(p)).convert("RGB") for p in pngs]
    inputs = encode_request(ld, images, text, text_at)
    with torch.no_grad():
        out = ld.model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=ld.im_end_id,
            pad_token_id=ld.pad_id,
        )
    new = out[0, inputs["input_ids"].shape[1]:]
    return ld.tokenizer.decode(new, skip_special_tokens=True)
