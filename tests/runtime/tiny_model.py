"""Build a tiny random Qwen2-VL checkpoint offline (config, safetensors, tokenizer with a chat
template, preprocessor config) so runtime tests never wait for, or depend on, a trained model;
plus what the runtime tests share: test images, chat messages and the one-process reference
``generate()`` that split results are compared against.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|image_pad|>", "<|video_pad|>"]
CORPUS = ["describe the image", "what colour is the shape", "a red circle on a white background",
          "a blue square and a green triangle", "the first image shows", "count the images",
          "user assistant system yes no one two three four five six seven eight"] * 20


def build_tiny_checkpoint(path: str | Path, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    ids = {t: tok.token_to_id(t) for t in SPECIALS}
    cfg = Qwen2VLConfig(
        text_config=dict(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                         bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                         pad_token_id=ids["<|endoftext|>"]),
        vision_config=dict(depth=2, embed_dim=64, hidden_size=64, num_heads=4, mlp_ratio=2, patch_size=14,
                           temporal_patch_size=2, spatial_merge_size=2, in_channels=3),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(cfg)
    with torch.no_grad():  # larger random weights so logits are far from uniform and tokens vary
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.save_pretrained(path)
    Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=112 * 112, patch_size=14, temporal_patch_size=2,
                             merge_size=2).save_pretrained(path)
    return path


def make_image(i: int, size: int = 84) -> bytes:
    """A distinct small PNG per ``i`` (deterministic)."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size + 14 * (i % 3), size), (250 - 20 * (i % 7), 240, 230 - 25 * (i % 5)))
    draw = ImageDraw.Draw(img)
    draw.ellipse([10 + i % 9, 10, 50 + 3 * (i % 5), 60], fill=((40 * i) % 256, (90 + 70 * i) % 256, 200))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


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


def decode_all(engine, results, params) -> dict[str, list[int]]:
    """Add every prefill result to ``engine`` as ``s0, s1, ...`` and step until all finish: the tokens per stream."""
    for i, r in enumerate(results):
        engine.add(f"s{i}", r, params)
    tokens: dict[str, list[int]] = {f"s{i}": [] for i in range(len(results))}
    while engine.num_running:
        for sid, tok, _ in engine.step():
            tokens[sid].append(tok)
    return tokens


def prefilled(bundle, images: list[bytes], n: int, max_tokens: int = 4) -> list:
    """``n`` prefill results (request i of images[i:2i+1]: 1, 2, 3... images) for decode tests."""
    from epdctl.runtime.encoder_engine import VisionEncoder
    from epdctl.runtime.prefill_engine import LanguagePrefill
    from epdctl.runtime.prompt import build_prompt
    from epdctl.runtime.sampling import SamplingParams

    enc, pre = VisionEncoder(bundle), LanguagePrefill(bundle)
    out = []
    for i in range(n):
        encoded = enc.encode(images[i:i + 1 + i])
        prompt = build_prompt(bundle, image_messages(len(encoded)), [e.grid_thw for e in encoded])
        out.append(pre.prefill(prompt, encoded, SamplingParams(max_tokens=max_tokens)))
    return out
