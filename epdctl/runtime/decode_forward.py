"""The decode step's forward as plain torch calls: the language model's own math, without its modules.

A decode step of the tiny model is ~250 small ops, and on one core most of its time was not the
ops but their wrapping: ``nn.Module.__call__`` for ~80 modules a step, transformers' kwarg and
config plumbing around every layer, the mask and output objects (a 2-row step 1.2-1.4 ms, 43
``F.linear`` calls ~0.4 ms of it). ``LeanForward`` runs the same ops in the same order on the
same weights (RMSNorm as transformers writes it, the model's own rotary embedding module once a
step, ``apply_rotary_pos_emb``, the slot cache's write and native attention, the gated MLP or
its packed copy), so its logits are bit for bit the module path's (tests/runtime/test_decode_forward.py).

It serves only what it was written for: Qwen2/Qwen2-VL-style text decoders (pre-norm, q/k/v/o
projections, full attention, gated MLP) in fp32 with the native attention kernel. ``lean_for``
returns None for anything else, and the engine keeps the module path.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

import torch
import torch.nn.functional as F
from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb

from .kv_slots import SlotCache
from .native_attention import attend
from .packed_gemm import PackedLayers


def _act(module: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation as a function: silu directly for transformers' SiLU modules (its forward)."""
    if type(module).__name__ in ("SiLUActivation", "SiLU"):
        return F.silu
    return module  # type: ignore[no-any-return]


class _Layer:
    __slots__ = ("ln_in", "eps_in", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo", "ln_post", "eps_post",
                 "gate", "up", "down", "act", "index")

    def __init__(self, layer: Any, index: int):
        attn, mlp = layer.self_attn, layer.mlp
        self.index = index
        self.ln_in, self.eps_in = layer.input_layernorm.weight, float(layer.input_layernorm.variance_epsilon)
        self.ln_post = layer.post_attention_layernorm.weight
        self.eps_post = float(layer.post_attention_layernorm.variance_epsilon)
        self.wq, self.bq = attn.q_proj.weight, attn.q_proj.bias
        self.wk, self.bk = attn.k_proj.weight, attn.k_proj.bias
        self.wv, self.bv = attn.v_proj.weight, attn.v_proj.bias
        self.wo, self.bo = attn.o_proj.weight, attn.o_proj.bias
        self.gate, self.up, self.down = mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight
        if mlp.gate_proj.bias is not None or mlp.up_proj.bias is not None or mlp.down_proj.bias is not None:
            raise ValueError("gated MLP with biases")
        self.act = _act(mlp.act_fn)


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Qwen2 RMSNorm, op for op (fp32: the casts are no-ops)."""
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


class LeanForward:
    """``logits = lean(ids, positions, cache, packed)`` for one decode step of n rows."""

    def __init__(self, lm: Any, lm_head: torch.nn.Linear, native: ctypes.CDLL):
        cfg = lm.config
        self.native = native
        self.embed = lm.embed_tokens
        self.rotary = lm.rotary_emb
        self.final_norm, self.final_eps = lm.norm.weight, float(lm.norm.variance_epsilon)
        self.head_w, self.head_b = lm_head.weight, lm_head.bias
        self.heads, self.kv_heads = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        self.dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.scaling = float(lm.layers[0].self_attn.scaling)
        self.layers = [_Layer(layer, i) for i, layer in enumerate(lm.layers)]

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, cache: SlotCache,
                 packed: PackedLayers | None) -> torch.Tensor:
        """ids [n, 1]; positions [3, n, 1]; the hidden state's logits [n, vocab] (fp32)."""
        n = ids.shape[0]
        x = self.embed(ids)  # [n, 1, hidden]
        cos, sin = self.rotary(x, positions)
        x = x.view(n, -1)
        heads, kv_heads, dim = self.heads, self.kv_heads, self.dim
        lengths = cache.cols + 1
        for layer in self.layers:
            h = _norm(x, layer.ln_in, layer.eps_in)
            q = F.linear(h, layer.wq, layer.bq).view(n, 1, heads, dim).transpose(1, 2)
            k = F.linear(h, layer.wk, layer.bk).view(n, 1, kv_heads, dim).transpose(1, 2)
            v = F.linear(h, layer.wv, layer.bv).view(n, 1, kv_heads, dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            keys, values = cache.update(k, v, layer.index)
            out = attend(self.native, q, keys, values, lengths, self.scaling)
            x = x + F.linear(out.reshape(n, -1), layer.wo, layer.bo)
            h = _norm(x, layer.ln_post, layer.eps_post)
            if packed is not None:
                x = x + packed.packed[layer.index](h)
            else:
                x = x + F.linear(layer.act(F.linear(h, layer.gate)) * F.linear(h, layer.up), layer.down)
        x = _norm(x, self.final_norm, self.final_eps)
        logits = packed.lm_head(x) if packed is not None else F.linear(x, self.head_w, self.head_b)
        return logits.float()


def lean_for(lm: Any, lm_head: torch.nn.Linear, native: ctypes.CDLL | None, dtype: torch.dtype) -> LeanForward | None:
    """A LeanForward for ``lm`` when it is a model this forward was written for; else None."""
    if native is None or dtype != torch.float32:
        return None
    if type(lm).__name__ not in ("Qwen2VLTextModel", "Qwen2Model"):
        return None
    cfg = lm.config
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or []) \
            or getattr(cfg, "use_sliding_window", False):
        return None
    try:
        return LeanForward(lm, lm_head, native)
    except (AttributeError, ValueError, TypeError):
        return None
