"""Attention for one batched decode step over KV slots: two grouped matmuls and one mask per step.

A decode step asks each running sequence's one new query to attend over its own slot (the
batch's [n, kv_heads, width, dim] view, see kv_slots.py) under a mask that hides each row's
unused columns. Done here as grouped matmuls (the queries of one KV head's group side by side,
so K and V are read once per group, never repeated) with one additive mask built per step,
faster on the decode's shapes than transformers' SDPA path (lab/benchmarks/bench_slot_attention.py
compares). Prompts (more than one query token) still go to SDPA. When the engine passes
``RowLengths`` instead of a mask, the step runs native_attention.py's C loop instead (each row
read to its own length only).

The decode engine selects it for its own forward only (``use_for``), registering it with
transformers' ``AttentionInterface`` under ``NAME``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from .native_attention import RowLengths, attend

NAME = "epd_slots"


def slot_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | RowLengths | None, scaling: float | None = None, dropout: float = 0.0,
                   **kwargs: Any) -> tuple[torch.Tensor, None]:
    """query [n, heads, 1, dim]; key/value [n, kv_heads, width, dim]; attention_mask additive
    [n, 1, 1, width] (or None), or RowLengths (fp32, one token per row). Returns [n, 1, heads, dim]
    like transformers' SDPA wrapper."""
    n, heads, q_len, dim = query.shape
    if isinstance(attention_mask, RowLengths):
        return attend(attention_mask.dll, query, key, value, attention_mask.valid,
                      dim ** -0.5 if scaling is None else scaling), None
    if q_len != 1 or (attention_mask is not None and attention_mask.dtype == torch.bool):
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    kv_heads = key.shape[1]
    group = heads // kv_heads
    q = query.reshape(n, kv_heads, group, dim)  # head h reads kv head h // group (repeat_kv's order)
    scores = torch.matmul(q, key.transpose(-1, -2))
    scores.mul_(dim ** -0.5 if scaling is None else scaling)
    if attention_mask is not None:
        scores.add_(attention_mask)
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, value)  # [n, kv_heads, group, dim]
    return out.reshape(n, 1, heads, dim), None


AttentionInterface.register(NAME, slot_attention)


_INTERNAL = "_attn_implementation_internal"  # what transformers' ``_attn_implementation`` property reads


@contextlib.contextmanager
def use_for(config: Any) -> Iterator[None]:
    """Run the model under ``config`` with slot attention for the duration (one thread owns the model).
    Sets the attribute the config's ``_attn_implementation`` property reads directly: the property's
    setter (a strict dataclass's validation, sub-configs) costs more than the step's attention."""
    if not hasattr(config, _INTERNAL) or getattr(config, "sub_configs", None):
        before = config._attn_implementation
        config._attn_implementation = NAME
        try:
            yield
        finally:
            config._attn_implementation = before
        return
    before = getattr(config, _INTERNAL)
    object.__setattr__(config, _INTERNAL, NAME)
    try:
        yield
    finally:
        object.__setattr__(config, _INTERNAL, before)
