"""Token sampling: greedy, temperature and nucleus (top-p), reproducible with a seed.

A seeded request draws token ``i`` with a uniform derived from ``(seed, i)`` alone (splitmix64),
so the prefill (token 0) and the decode worker (tokens 1..) need not ship generator state between
processes and a split deployment samples exactly what a colocated one does. The decode samples
every running sequence of a step in one batched call (``sample_batch``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch


@dataclass
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False  # benchmarks: run to max_tokens (stop_token_ids still apply)

    def to_dict(self) -> dict:
        return {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "seed": self.seed, "stop_token_ids": list(self.stop_token_ids), "ignore_eos": self.ignore_eos}

    @classmethod
    def for_answer(cls, *, max_tokens: int, temperature: float, top_p: float, seed: int | None,
                   eos_token_ids: list[int], ignore_eos: bool = False) -> "SamplingParams":
        """A client's request: the model's EOS ends the answer, unless ``ignore_eos`` (SGLang's
        and vLLM's extension: run to max_tokens)."""
        return cls(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed,
                   stop_token_ids=[] if ignore_eos else list(eos_token_ids), ignore_eos=ignore_eos)

    @classmethod
    def from_dict(cls, d: dict) -> "SamplingParams":
        return cls(**{k: d[k] for k in ("max_tokens", "temperature", "top_p", "seed", "stop_token_ids",
                                            "ignore_eos") if k in d})


_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def seeded_uniform(seed: int, index: int) -> float:
    """The uniform in [0, 1) that token ``index`` of a request seeded ``seed`` is drawn with."""
    return (_splitmix64((int(seed) * 1_000_003 + index) & _MASK64) >> 11) * 2.0 ** -53


def sample_batch(logits: torch.Tensor, params: Sequence[SamplingParams], indices: Sequence[int]) -> list[int]:
    """One token per row of ``logits`` [n, vocab]: row i follows ``params[i]`` and is the
    ``indices[i]``-th generated token of its request. One batched pass for every row (greedy rows
    take the argmax; sampled rows one softmax, sort and inverse-CDF draw together) and one
    device-to-host copy: the same dozen tensor ops per step however many streams run, rather than
    a draw per row."""
    tokens = torch.argmax(logits, dim=-1)
    rows = [i for i, p in enumerate(params) if p.temperature > 0]
    if rows:
        sub = logits if len(rows) == len(params) else logits[rows]
        temps = torch.tensor([[params[i].temperature] for i in rows], dtype=torch.float32)
        top_p = torch.tensor([[params[i].top_p] for i in rows], dtype=torch.float32)
        probs = torch.softmax(sub.float() / temps, dim=-1)
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        keep = (cum - sorted_p) < top_p  # the smallest prefix whose mass reaches top_p
        keep[:, 0] = True
        last = keep.sum(dim=-1, keepdim=True) - 1
        total = cum.gather(1, last)
        u = _uniforms([params[i] for i in rows], [indices[i] for i in rows])
        choice = torch.searchsorted(cum, u * total, right=True).clamp_(max=last)
        drawn = order.gather(1, choice).squeeze(1)
        if len(rows) == len(params):
            return drawn.tolist()
        tokens[rows] = drawn
    return tokens.tolist()


def _uniforms(params: list[SamplingParams], indices: list[int]) -> torch.Tensor:
    """[m, 1] uniforms: seeded rows from (seed, index), the others from torch's global RNG."""
    u = torch.tensor([-1.0 if p.seed is None else seeded_uniform(p.seed, i) for p, i in zip(params, indices)],
                     dtype=torch.float64)
    unseeded = u < 0
    if bool(unseeded.any()):
        u[unseeded] = torch.rand(int(unseeded.sum()), dtype=torch.float64)
    return u.float().unsqueeze(1)


def sample(logits: torch.Tensor, params: SamplingParams, index: int) -> int:
    """Pick token ``index`` of a request from ``logits`` [vocab] (``sample_batch`` of one row)."""
    return sample_batch(logits.unsqueeze(0), [params], [index])[0]
