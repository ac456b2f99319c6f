"""Chat messages -> token ids, with each image placeholder expanded to its embedding count.

The checkpoint's own chat template renders one ``<|image_pad|>`` per image part; Qwen2-VL needs
``t*h*w / merge**2`` pads per image (one per merged vision token), known only after encoding.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import BadRequestError
from .model import ModelBundle


@dataclass
class Prompt:
    input_ids: list[int]
    image_token_counts: list[int]
    text: str


def image_token_count(grid: tuple[int, int, int], merge_size: int) -> int:
    t, h, w = grid
    return int(t * h * w) // (merge_size * merge_size)


def build_prompt(bundle: ModelBundle, messages: list[dict], grids: list[tuple[int, int, int]]) -> Prompt:
    """Apply the chat template (generation prompt added) and expand image pads per ``grids``."""
    try:
        text = bundle.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # jinja errors: malformed message list
        raise BadRequestError(400, f"messages: cannot apply the chat template ({exc})") from exc
    ids = bundle.tokenizer(text, add_special_tokens=False)["input_ids"]
    pad = bundle.image_token_id
    n_pads = sum(1 for i in ids if i == pad)
    if n_pads != len(grids):
        raise BadRequestError(400, f"messages: the prompt holds {n_pads} image placeholder(s) "
                                   f"but {len(grids)} image(s) were given")
    counts = [image_token_count(g, bundle.merge_size) for g in grids]
    out: list[int] = []
    k = 0
    for tok in ids:
        if tok == pad:
            out.extend([pad] * counts[k])
            k += 1
        else:
            out.append(tok)
    return Prompt(input_ids=out, image_token_counts=counts, text=text)
