"""Fixtures for runtime tests: a tiny random Qwen2-VL checkpoint built offline once per session,
and a bundle loaded from it (colocated: both halves of the model).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny_model import build_tiny_checkpoint, make_image  # noqa: E402


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen2vl"))


@pytest.fixture(scope="session")
def bundle(tiny_ckpt):
    from epdctl.runtime.model import load_bundle

    return load_bundle(str(tiny_ckpt), role="colocated")


@pytest.fixture(scope="session")
def images() -> list[bytes]:
    return [make_image(i) for i in range(10)]


def image_messages(n: int, text: str = "describe the image") -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}] * n + [{"type": "text", "text": text}]}]


def reference_generate(bundle, images: list[bytes], messages: list[dict], max_new_tokens: int):
    """One-process ``generate()`` of the full model: (prompt ids, new tokens, per-token logits)."""
    import torch

    from epdctl.runtime.encoder_engine import decode_image
    from epdctl.runtime.prompt import build_prompt

    feats = bundle.image_processor(images=[decode_image(i, b) for i, b in enumerate(images)], return_tensors="pt")
    grids = [tuple(g) for g in feats["image_grid_thw"].tolist()]
    prompt = build_prompt(bundle, messages, grids)
    ids = torch.tensor([prompt.input_ids])
    with torch.inference_mode():
        out = bundle.model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=feats["pixel_values"],
            image_grid_thw=feats["image_grid_thw"], mm_token_type_ids=(ids == bundle.image_token_id).int(),
            max_new_tokens=max_new_tokens, do_sample=False, output_logits=True, return_dict_in_generate=True,
            eos_token_id=bundle.eos_token_ids, pad_token_id=bundle.tokenizer.pad_token_id)
    return prompt.input_ids, out.sequences[0, ids.shape[1]:].tolist(), [lg[0].float() for lg in out.logits]
