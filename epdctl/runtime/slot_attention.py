"""Attention for one batched decode step over KV slots: two grouped matmuls and one mask per step.

A decode step asks each running sequence's one new query to attend over its own slot (the
batch's [n, kv_heads, width, dim] view, see kv_slots.py) under a mask that hides each row's
unused columns. Done here as two batched matmuls (bmm) over [n * kv_heads] blocks, the queries
of one KV head's group side by side, so K and V are read once per group, never repeated, and
read in place from the slot table, with one additive mask built per step. Measured against
transformers' SDPA path (torch's masked CPU flash kernel) on the decode's shapes: 87 -> 71 us
per layer for 16 rows on one thread with 4-d matmuls, equal for one row; bmm on 3-d views of
the same tensors instead of matmul's 4-d path cut the profiled attention of a 16-stream step
from 40 to 30 us per stream (benchmarks/bench_slot_attention.py, profile_decode_step.py).
Prompts (more than one query token) still go to SDPA.

The decode engine selects it for its own forward only (``use_for``), registering it with
transformers' ``AttentionInterface`` under ``NAME``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "epd_slots"


def slot_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                   **kwargs: Any) -> tuple[torch.Tensor, None]:
    """query [n, heads, 1, dim]; key/value [n, kv_heads, width, dim]; attention_mask additive
    [n, 1, 1, width] (or None). Returns [n, 1, heads, dim] like transformers' SDPA wrapper."""
    n, heads, q_len, dim = query.shape
    if q_len != 1 or (attention_mask is not None and attention_mask.dtype == torch.bool):
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    kv_heads, width = key.shape[1], key.shape[2]
    group = heads // kv_heads
    # head h reads kv head h // group (repeat_kv's order): [n * kv_heads, group, dim] row blocks
    q = query.reshape(n * kv_heads, group, dim)
    scores = torch.bmm(q, _batched(key, n * kv_heads).transpose(1, 2))
    scores.mul_(dim ** -0.5 if scaling is None else scaling)
    if attention_mask is not None:
        scores.view(n, kv_heads, group, width).add_(attention_mask)
    probs = torch.softmax(scores, dim=-1)
    out = torch.bmm(probs, _batched(value, n * kv_heads))  # [n * kv_heads, group, dim]
    return out.view(n, 1, heads, dim), None


def _batched(t: torch.Tensor, rows: int) -> torch.Tensor:
    """[n, kv_heads, width, dim] -> [n * kv_heads, width, dim]: a view when the slot table's rows and heads
    merge (always for kv_slots' tables), a copy otherwise. bmm reads the strided view directly, where
    matmul's 4-d path costs ~1.4x the time on the decode's shapes (benchmarks/bench_slot_attention.py)."""
    return t.reshape(rows, t.shape[2], t.shape[3])


def additive_mask(lengths: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
    """[n, 1, 1, width]: 0 where row i may look (columns 0..lengths[i]), the dtype's min elsewhere."""
    seen = torch.arange(width).view(1, -1) <= lengths.view(-1, 1)
    return torch.zeros(seen.shape, dtype=dtype).masked_fill_(~seen, torch.finfo(dtype).min).view(-1, 1, 1, width)


AttentionInterface.register(NAME, slot_attention)


@contextlib.contextmanager
def use_for(config: Any) -> Iterator[None]:
    """Run the model under ``config`` with slot attention for the duration (one thread owns the model)."""
    before = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = before
