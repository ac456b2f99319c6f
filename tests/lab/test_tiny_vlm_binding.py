"""lab/model/tiny_vlm_binding.py: same-colour requests and the attention probe on the committed model."""

from __future__ import annotations

import random
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "tiny-qwen2vl"

from tiny_vlm_binding import attention, request, score  # noqa: E402
from tiny_vlm_common import load  # noqa: E402


def test_same_colour_requests_share_the_first_drawing_s_colour() -> None:
    rng = random.Random(3)
    for _ in range(5):
        drawn = request(rng, True)
        assert 3 <= len(drawn) <= 4
        assert len({d.item.colour for d in drawn}) == 1
    assert any(len({d.item.colour for d in request(rng, False)}) > 1 for _ in range(5))


def test_the_probe_scores_both_kinds_and_locates_image_k_per_layer() -> None:
    torch.set_num_threads(1)
    ld = load(MODEL)
    acc = score(ld, requests=2, seed=9)
    for kind in ("same_colour", "mixed_colour"):
        assert acc[kind]["images"] >= 6
        assert 0.0 <= acc[kind]["in_request"] <= 1.0 and 0.0 <= acc[kind]["alone"] <= 1.0
    att = attention(ld, requests=1, seed=9)
    layers = ld.model.config.text_config.num_hidden_layers
    for where in ("colour", "shape"):
        assert sorted(att[where], key=int) == [str(i) for i in range(layers)]
        for row in att[where].values():
            assert 0.0 <= row["on_image_k"] + row["on_other_images"] <= 1.001
    # The committed model's colour lookup: some layer's head is almost all on image k.
    assert max(r["on_image_k"] for r in att["colour"].values()) > 0.9
