"""Language-model prefill from a prompt plus image embeddings made by any encoder.

Qwen2-VL's M-RoPE gives image tokens 3-D positions, so after the prompt the text position runs
ahead of/behind the token count by ``rope_delta``; it travels with the KV cache because decode
positions are ``cache_len + rope_delta`` on all three axes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from .encoder_engine import EncodedImage
from .errors import BadRequestError, RuntimeWorkerError
from .model import ModelBundle
from .prompt import Prompt
from .sampling import SamplingParams, sample


@dataclass
class PrefillResult:
    first_token: int
    first_logits: torch.Tensor                       # [vocab]
    kv: list[tuple[torch.Tensor, torch.Tensor]]      # per layer (k, v) [1, n_kv_heads, seq, head_dim]
    rope_delta: int
    prompt_len: int


def cache_layers(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (keys, values) after a forward (every layer of these models is full attention)."""
    out = []
    for i, layer in enumerate(cache.layers):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
            raise RuntimeWorkerError(f"KV cache layer {i} ({type(layer).__name__}) holds no keys/values tensors; "
                                     "only full-attention language models are supported")
        out.append((keys, values))
    return out


class LanguagePrefill:
    def __init__(self, bundle: ModelBundle):
        inner = bundle.model.model
        if getattr(inner, "language_model", None) is None:
            raise ValueError("LanguagePrefill needs a bundle loaded with the language model (prefill/colocated)")
        self.bundle = bundle
        self.inner = inner
        self.lm = inner.language_model
        self.lm_head = bundle.model.lm_head
        self.text_config = bundle.config.text_config

    def _positions(self, ids: torch.Tensor, images: list[EncodedImage]) -> tuple[torch.Tensor, int]:
        if not images:
            pos = torch.arange(ids.shape[1]).view(1, 1, -1).expand(3, 1, -1)
            return pos, 0
        mm = (ids == self.bundle.image_token_id).int()
        grid = torch.tensor([list(e.grid_thw) for e in images], dtype=torch.long)
        pos, deltas = self.inner.get_rope_index(ids, mm_token_type_ids=mm, image_grid_thw=grid)
        return pos, int(deltas.view(-1)[0])

    @torch.inference_mode()
    def prefill(self, prompt: Prompt, images: list[EncodedImage], sampling: SamplingParams) -> PrefillResult:
        if len(images) != len(prompt.image_token_counts):
            raise BadRequestError(400, f"prompt expects {len(prompt.image_token_counts)} image(s), got {len(images)}")
        for i, (img, n) in enumerate(zip(images, prompt.image_token_counts)):
            if img.embeds.shape[0] != n:
                raise RuntimeWorkerError(f"image {i}: {img.embeds.shape[0]} embeddings for {n} placeholder tokens; "
                                         "encoder and prefill must load the same checkpoint")
        ids = torch.tensor([prompt.input_ids], dtype=torch.long)
        embeds = self.lm.embed_tokens(ids)
        if images:
            vision = torch.cat([e.embeds for e in images]).to(embeds.dtype)
            mask = (ids == self.bundle.image_token_id).unsqueeze(-1)
            embeds = embeds.masked_scatter(mask, vision)
        pos, delta = self._positions(ids, images)
        cache = DynamicCache(config=self.text_config)
        out = self.lm(inputs_embeds=embeds, position_ids=pos, cache=cache, use_cache=True)
        logits = self.lm_head(out.last_hidden_state[:, -1]).float()[0]
        first = sample(logits, sampling, 0)
        return PrefillResult(first_token=first, first_logits=logits, kv=cache_layers(cache), rope_delta=delta,
                             prompt_len=ids.shape[1])
