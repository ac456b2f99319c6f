"""The decode step's MLP and lm_head GEMMs through oneDNN with prepacked weights, for wide batches.

torch's fp32 ``nn.Linear`` calls MKL, which on some hosts runs code for a narrower vector unit
than the CPU has, where oneDNN, with the weight reordered once into its blocked layout, uses the
full width. On the decode's shapes oneDNN wins once a call holds enough work (gate+up as ONE
GEMM, down, lm_head), while at one row it loses (a fixed cost per call against MKL's GEMV). So
the decode engine uses these only for batches of ``MIN_ROWS`` or more (``packed_for``), and MKL
below: a one-stream step is unchanged. Both accumulate in fp32; tokens do not depend on which
path a step took (the engine's tests check batched tokens and logits against each sequence
decoded alone).

Weights are copied (packed) once when the decode engine starts; the model must not be trained
in place afterwards (no role does). The copy doubles the MLPs' and lm_head's memory, so models
whose copy would exceed ``MAX_COPY_BYTES`` (a real Qwen2-VL: gigabytes) keep MKL throughout.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Protocol

import torch

MIN_ROWS = 8  # at 8+ rows oneDNN's packed GEMMs beat MKL on every decode shape measured
MAX_COPY_BYTES = 256 << 20  # the tiny model's copy: ~6 MB


def available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _pack(weight: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), rows)


def _linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [None], "")


class PackedLinear:
    """``linear(x)`` with ``linear``'s weight (and bias) packed for oneDNN."""

    def __init__(self, linear: torch.nn.Linear, rows: int = 16):
        self.weight = _pack(linear.weight, rows)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _linear(x, self.weight, self.bias)


class GatedMLP(Protocol):
    """What PackedMLP reads of a gated MLP (transformers' Qwen2MLP)."""

    gate_proj: torch.nn.Linear
    up_proj: torch.nn.Linear
    down_proj: torch.nn.Linear
    act_fn: Callable[[torch.Tensor], torch.Tensor]


class PackedMLP:
    """A gated MLP (``down(act(gate(x)) * up(x))``, Qwen2's) with gate and up fused into one GEMM."""

    def __init__(self, mlp: GatedMLP, rows: int = 16):
        gate, up, down = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        if gate.bias is not None or up.bias is not None:
            raise ValueError("PackedMLP expects bias-free gate/up projections")
        self.inter: int = gate.out_features
        self.gate_up: torch.Tensor = _pack(torch.cat([gate.weight.detach(), up.weight.detach()]), rows)
        self.down: PackedLinear = PackedLinear(down, rows)
        self.act: Callable[[torch.Tensor], torch.Tensor] = mlp.act_fn

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        gu = _linear(x.reshape(-1, shape[-1]), self.gate_up, None)
        h = self.act(gu[:, :self.inter]).mul_(gu[:, self.inter:])
        return self.down(h).view(*shape[:-1], -1)


class PackedLayers:
    """Packed copies of a language model's MLPs and lm_head; swapped in for one wide step at a time."""

    def __init__(self, lm: Any, lm_head: torch.nn.Linear, rows: int = 16):
        self.mlps = [layer.mlp for layer in lm.layers]
        self.packed = [PackedMLP(m, rows) for m in self.mlps]
        self.lm_head = PackedLinear(lm_head, rows)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """The model's MLPs run packed for the duration (instance attributes; the class is untouched).
        Written to the modules' ``__dict__`` directly: nn.Module's ``__setattr__`` costs more per step."""
        for mlp, packed in zip(self.mlps, self.packed):
            mlp.__dict__["forward"] = packed
        try:
            yield
        finally:
            for mlp in self.mlps:
                mlp.__dict__.pop("forward", None)


def packed_for(lm: Any, lm_head: torch.nn.Linear, max_copy_bytes: int = MAX_COPY_BYTES) -> PackedLayers | None:
    """PackedLayers for ``lm`` when oneDNN is there, the model has Qwen2's fp32 gated MLP and the
    packed copy fits ``max_copy_bytes``; else None (MKL for every step)."""
    if not available() or lm_head.weight.dtype != torch.float32:
        return None
    try:
        copy = sum(p.numel() * p.element_size() for layer in lm.layers for p in layer.mlp.parameters())
    except AttributeError:
        return None
    if copy + lm_head.weight.numel() * lm_head.weight.element_size() > max_copy_bytes:
        return None
    try:
        return PackedLayers(lm, lm_head)
    except (AttributeError, ValueError, RuntimeError):
        return None
