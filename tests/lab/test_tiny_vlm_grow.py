"""Growing the tiny Qwen2-VL's text model (lab/model/tiny_vlm_build.py): more layers, same function,
and the image-count curriculum's --many-frac (lab/model/tiny_vlm_data.py)."""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pytest
import torch

from tiny_vlm_build import (build_model, build_tokenizer, grown_state,
                            load_init, make_image_processor, save)
from tiny_vlm_data import Batcher, count_for


def _args(layers: int, seed: int) -> argparse.Namespace:
    return argparse.Namespace(hidden=64, layers=layers, vision_embed=64, seed=seed)


@pytest.fixture(scope="module")
def tok() -> object:
    return build_tokenizer()


def _logits(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(**{k: v for k, v in batch.items() if k != "items"}).logits


def test_a_grown_model_computes_what_the_checkpoint_computed(tok: object, tmp_path: Path) -> None:
    small = build_model(tok, _args(2, seed=5))
    # Random init leaves no projection at zero; perturb so every layer matters.
    with torch.no_grad():
        for p in small.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    proc = make_image_processor()
    save(small, tok, proc, tmp_path / "two", {"steps": 1})
    big = build_model(tok, _args(3, seed=6))
    report = load_init(big, tok, tmp_path / "two")
    assert report == {"steps": 1}
    assert big.config.text_config.num_hidden_layers == 3
    batch = Batcher(tok, proc).batch(random.Random(3), [3, 1])
    a, b = _logits(small, batch), _logits(big, batch)
    assert a.shape == b.shape
    assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    # ...and it is not a copy of the small one: the new layer is there, outputs zeroed.
    names = [k for k in big.state_dict() if "layers.2." in k and "visual" not in k]
    assert any(k.endswith("o_proj.weight") for k in names)


def test_grown_state_spreads_new_layers_and_zeroes_their_outputs() -> None:
    state = {}
    for i in range(4):
        for part in ("self_attn.o_proj.weight", "mlp.down_proj.weight", "self_attn.q_proj.weight"):
            state[f"model.language_model.layers.{i}.{part}"] = torch.full((2, 2), float(i + 1))
    state["model.visual.blocks.0.layers.0.mlp.down_proj.weight"] = torch.ones(1)  # not text
    grown = grown_state(state, 4, 6)
    q = [grown[f"model.language_model.layers.{j}.self_attn.q_proj.weight"][0, 0].item()
         for j in range(6)]
    assert q == [1, 2, 2, 3, 4, 4]  # copies follow old layers 1 and 3
    o = [grown[f"model.language_model.layers.{j}.self_attn.o_proj.weight"].abs().sum().item()
         for j in range(6)]
    assert [x == 0 for x in o] == [False, False, True, False, False, True]
    assert grown["model.visual.blocks.0.layers.0.mlp.down_proj.weight"].item() == 1


def test_many_frac_draws_five_to_eight_images_and_is_off_by_default() -> None:
    args = argparse.Namespace(single_steps=0, ramp=0, many_frac=1.0)
    rng = random.Random(1)
    assert {count_for(rng, 10, args) for _ in range(200)} == {5, 6, 7, 8}
    # Off: the same draws as before the option existed (earlier stages reproduce bit for bit).
    off = argparse.Namespace(single_steps=0, ramp=0, many_frac=0.0)
    r1, r2 = random.Random(9), random.Random(9)
    assert [count_for(r1, 10, off) for _ in range(50)] == [r2.randint(1, 8) for _ in range(50)]
