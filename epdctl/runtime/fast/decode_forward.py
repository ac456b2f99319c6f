"""The decode step's forward as plain torch calls: the language model's own math, without its modules.

A decode step of the tiny model is ~250 small ops, and on one core most of its time was not the
ops but their wrapping: ``nn.Module.__call__`` for ~80 modules a step, transformers' kwarg and
config plumbing around every layer, the mask and output objects. ``LeanForward`` runs the same
math on the same weights (RMSNorm as transformers writes it, the model's own rotary embedding
module once a step, rotate_half, the slot cache's write and native attention, the gated MLP or
its packed copy), with q/k/v as one GEMM, gate/up as one, and q and k rotated together; the
logits equal the module path's where the fused GEMMs give the separate ones' bits
(tests/runtime/test_decode_forward.py; benchmarks/bench_runtime_paths.py times both paths).

It serves only what it was written for: Qwen2-VL text decoders (pre-norm, q/k/v/o
projections, full attention, bias-free gated MLP) in fp32 with the native attention kernel, small
enough that the fused weight copies stay under packed_gemm.MAX_COPY_BYTES (a real-size model's
step is its GEMMs, not their wrapping). ``lean_for`` returns None for anything else, and the
engine keeps the module path.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any, Callable

import torch
import torch.nn.functional as F
from transformers.models.qwen2_vl.modeling_qwen2_vl import rotate_half

from ..kv_slots import SlotCache
from .native_attention import attend
from .packed_gemm import MAX_COPY_BYTES, PackedLayers

log = logging.getLogger(__name__)


def _act(module: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation as a function: silu directly for transformers' SiLU modules (its forward)."""
    if type(module).__name__ in ("SiLUActivation", "SiLU"):
        return F.silu
    return module  # type: ignore[no-any-return]


class _Layer:
    __slots__ = ("ln_in", "eps_in", "wqkv", "bqkv", "wo", "bo", "ln_post", "eps_post", "gate_up", "inter", "down",
                 "act", "index")

    def __init__(self, layer: Any, index: int):
        attn, mlp = layer.self_attn, layer.mlp
        self.index = index
        self.ln_in, self.eps_in = layer.input_layernorm.weight, float(layer.input_layernorm.variance_epsilon)
        self.ln_post = layer.post_attention_layernorm.weight
        self.eps_post = float(layer.post_attention_layernorm.variance_epsilon)
        projs = (attn.q_proj, attn.k_proj, attn.v_proj)
        self.wqkv = torch.cat([p.weight.detach() for p in projs])  # q, k and v as ONE GEMM
        biases = [p.bias for p in projs]
        self.bqkv = None if all(b is None for b in biases) else torch.cat(
            [b.detach() if b is not None else torch.zeros(p.out_features, dtype=p.weight.dtype)
             for b, p in zip(biases, projs)])
        self.wo, self.bo = attn.o_proj.weight, attn.o_proj.bias
        if mlp.gate_proj.bias is not None or mlp.up_proj.bias is not None or mlp.down_proj.bias is not None:
            raise ValueError("gated MLP with biases")
        self.gate_up = torch.cat([mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach()])  # ONE GEMM
        self.inter = int(mlp.gate_proj.out_features)
        self.down = mlp.down_proj.weight
        self.act = _act(mlp.act_fn)


def copy_bytes(lm: Any) -> int:
    """What the fused q/k/v and gate/up copies of ``lm``'s layers take."""
    return sum(p.numel() * p.element_size() for layer in lm.layers
               for m in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                         layer.mlp.gate_proj, layer.mlp.up_proj) for p in m.parameters())


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
        cos, sin = self.rotary(x, positions)  # [n, 1, dim] each
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # against [n, heads, 1, dim], as apply_rotary_pos_emb
        x = x.view(n, -1)
        heads, kv_heads, dim = self.heads, self.kv_heads, self.dim
        lengths = cache.cols + 1
        for layer in self.layers:
            h = _norm(x, layer.ln_in, layer.eps_in)
            qkv = F.linear(h, layer.wqkv, layer.bqkv).view(n, heads + 2 * kv_heads, 1, dim)
            qk = qkv[:, :heads + kv_heads]  # rotated together: the same elementwise ops as q and k apart
            qk = qk * cos + rotate_half(qk) * sin
            keys, values = cache.update(qk[:, heads:], qkv[:, heads + kv_heads:], layer.index)
            out = attend(self.native, qk[:, :heads], keys, values, lengths, self.scaling)
            x = x + F.linear(out.reshape(n, -1), layer.wo, layer.bo)
            h = _norm(x, layer.ln_post, layer.eps_post)
            if packed is not None:
                x = x + packed.packed[layer.index](h)
            else:
                gu = F.linear(h, layer.gate_up)
                x = x + F.linear(layer.act(gu[:, :layer.inter]) * gu[:, layer.inter:], layer.down)
        x = _norm(x, self.final_norm, self.final_eps)
        logits = packed.lm_head(x) if packed is not None else F.linear(x, self.head_w, self.head_b)
        return logits.float()


def lean_for(lm: Any, lm_head: torch.nn.Linear, native: ctypes.CDLL | None, dtype: torch.dtype,
             max_rows: int = 64) -> LeanForward | None:
    """A LeanForward for ``lm`` when it is a model this forward was written for and its fused GEMMs
    give the separate ones' bits at every step width up to ``max_rows``; else None."""
    if native is None or dtype != torch.float32:
        return None
    if type(lm).__name__ != "Qwen2VLTextModel":  # M-RoPE positions [3, n, 1], as the engine passes
        return None
    cfg = lm.config
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or []) \
            or getattr(cfg, "use_sliding_window", False):
        return None
    try:
        if copy_bytes(lm) > MAX_COPY_BYTES:  # a real-size model: its GEMMs, not the wrapping, fill a step
            return None
        lean = LeanForward(lm, lm_head, native)
    except (AttributeError, ValueError, TypeError):
        return None
    if not fuses_exactly(lm.layers[0], max_rows, lean.layers[0]):
        log.info("decode: the fused q/k/v or gate/up GEMM does not give the separate GEMMs' bits on "
                 "this host; decode steps run through the model's modules")
        return None
    return lean


def check_widths(max_rows: int) -> list[int]:
    """The step widths ``fuses_exactly`` compares: 1..64, then powers of two, then ``max_rows``."""
    wide = [1 << k for k in range(7, max(7, max_rows.bit_length()))]
    return sorted({*range(1, min(max_rows, 64) + 1), *(w for w in wide if w <= max_rows), max(max_rows, 1)})


def fuses_exactly(layer: Any, max_rows: int = 64, fused: "_Layer | None" = None) -> bool:
    """Whether q/k/v (and gate/up) as one GEMM give exactly the separate GEMMs' values here.

    The fused GEMM has more output columns; whether the BLAS keeps each column's reduction order
    then depends on its kernels, hence on the host. Tokens must equal the module path's, so the
    lean forward is used only where a check at the step widths it can see says so: every width
    up to 64 (the runtime's default most running sequences), then each power of two and
    ``max_rows`` itself (a full sweep of a larger batch costs seconds at start); every layer has
    the same shapes, so the first one stands for all. ``fused``: the layer's fused copy when the
    caller has built it already."""
    fused = fused or _Layer(layer, 0)
    attn, mlp = layer.self_attn, layer.mlp
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n in check_widths(max_rows):
            h = torch.randn(n, fused.wqkv.shape[1], generator=gen, dtype=fused.wqkv.dtype)
            apart = torch.cat([F.linear(h, p.weight, p.bias) for p in (attn.q_proj, attn.k_proj, attn.v_proj)], -1)
            if not torch.equal(F.linear(h, fused.wqkv, fused.bqkv), apart):
                return False
            apart = torch.cat([F.linear(h, mlp.gate_proj.weight), F.linear(h, mlp.up_proj.weight)], -1)
            if not torch.equal(F.linear(h, fused.gate_up), apart):
                return False
    return True
