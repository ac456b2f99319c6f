"""The decode step's attention over KV slots equals transformers' SDPA path on the same inputs."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from epdctl.runtime.fast.slot_attention import NAME, slot_attention, use_for
from epdctl.runtime.kv_slots import additive_mask


class _Attn(torch.nn.Module):
    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 4), (8, 1)])
def test_one_token_rows_of_different_lengths_match_sdpa(heads, kv_heads):
    g = torch.Generator().manual_seed(heads * 10 + kv_heads)
    lengths = torch.tensor([3, 17, 40, 9, 0])
    n, width, dim = len(lengths), int(lengths.max()) + 1, 16
    table_k = torch.randn(8, kv_heads, 64, dim, generator=g)  # a slot table: the batch is a strided view of it
    table_v = torch.randn(8, kv_heads, 64, dim, generator=g)
    k, v = table_k[:n, :, :width], table_v[:n, :, :width]
    q = torch.randn(n, heads, 1, dim, generator=g)
    module = _Attn(heads // kv_heads)
    seen = (torch.arange(width).view(1, -1) <= lengths.view(-1, 1)).view(n, 1, 1, width)
    want, _ = sdpa_attention_forward(module, q, k, v, seen, scaling=0.3)
    got, _ = slot_attention(module, q, k, v, additive_mask(lengths, width, torch.float32), scaling=0.3)
    assert got.shape == want.shape == (n, 1, heads, dim)
    assert torch.allclose(got, want, atol=1e-5)
    poked = table_k.clone()
    poked[0, :, int(lengths[0]) + 1:width] = 1e4  # columns past a row's length are never read
    again, _ = slot_attention(module, q, poked[:n, :, :width], v, additive_mask(lengths, width, torch.float32),
                              scaling=0.3)
    assert torch.allclose(again, got)


def test_prompts_and_boolean_masks_go_to_sdpa():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=g) for _ in range(3))
    module = _Attn(1)
    want, _ = sdpa_attention_forward(module, q, k, v, None, scaling=0.5)
    got, _ = slot_attention(module, q, k, v, None, scaling=0.5)
    assert torch.equal(got, want)


def test_use_for_restores_the_configured_attention():
    class Config:
        _attn_implementation = "sdpa"

    cfg = Config()
    with pytest.raises(RuntimeError):
        with use_for(cfg):
            assert cfg._attn_implementation == NAME
            raise RuntimeError("a failed step")
    assert cfg._attn_implementation == "sdpa"
