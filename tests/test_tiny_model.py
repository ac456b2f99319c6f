"""The committed tiny Qwen2-VL checkpoint: loads the generic way and names plainly drawn shapes."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "tiny-qwen2vl"

from tiny_vlm_common import IMAGE_PAD, Loaded, answer, encode_request, load  # noqa: E402

from epdctl import shapes  # noqa: E402


@pytest.fixture(scope="module")
def loaded() -> Loaded:
    torch.set_num_threads(2)
    return load(MODEL)


def test_checkpoint_files_and_size_bound() -> None:
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "preprocessor_config.json", "generation_config.json", "training_report.json"):
        assert (MODEL / name).is_file(), name
    assert (MODEL / "model.safetensors").stat().st_size < 20 * 1024 * 1024
    pre = json.loads((MODEL / "preprocessor_config.json").read_text())
    assert pre["image_processor_type"] == "Qwen2VLImageProcessorPil"
    report = json.loads((MODEL / "training_report.json").read_text())
    assert report["steps"] > 0


def test_chat_template_marks_each_image_like_qwen2vl(loaded: Loaded) -> None:
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "image_url"},
                                         {"type": "text", "text": "Hi?"}]}]
    text = loaded.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>user\nPicture 1: <|vision_start|><|image_pad|><|vision_end|>"
        "Picture 2: <|vision_start|><|image_pad|><|vision_end|>Hi?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = loaded.tokenizer("a\nb", add_special_tokens=False)["input_ids"]
    assert loaded.tokenizer.decode(ids) == "a\nb"


def test_each_image_becomes_four_pad_tokens(loaded: Loaded) -> None:
    pngs, q, _ = shapes.make_request(random.Random(0), 2)
    images = [Image.open(io.BytesIO(p)).convert("RGB") for p in pngs]
    inputs = encode_request(loaded, images, q)
    assert inputs["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 4]]
    assert int((inputs["input_ids"] == loaded.image_pad_id).sum()) == 8
    assert loaded.tokenizer.convert_ids_to_tokens(loaded.image_pad_id) == IMAGE_PAD


def test_answers_a_three_image_plain_request(loaded: Loaded) -> None:
    items = [shapes.Item("circle", "red"), shapes.Item("square", "blue"),
             shapes.Item("triangle", "yellow")]
    pngs = [shapes.to_png(shapes.draw(it.shape, it.colour)) for it in items]
    text = answer(loaded, pngs, shapes.question())
    assert shapes.parse_answer(text, 3) == items, text
    assert text == shapes.answer_for(items)
