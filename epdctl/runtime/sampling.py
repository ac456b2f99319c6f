"""Token sampling: greedy, temperature and nucleus (top-p), reproducible with a seed.

A seeded request draws token ``i`` from a generator seeded with ``(seed, i)``, so the prefill
(token 0) and the decode worker (tokens 1..) need not ship generator state between processes
and a split deployment samples exactly what a colocated one does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


def token_generator(params: SamplingParams, index: int) -> torch.Generator | None:
    """Generator for the ``index``-th generated token (None: unseeded, use torch's global RNG)."""
    if params.seed is None or params.temperature <= 0:
        return None
    g = torch.Generator()
    g.manual_seed((int(params.seed) * 1_000_003 + index) % (2**63 - 1))
    return g


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Pick one token id from ``logits`` [vocab]."""
    if params.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        drop = (cum - sorted_p) >= params.top_p  # keep the smallest prefix whose mass reaches top_p
        drop[0] = False
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        choice = torch.multinomial(sorted_p / sorted_p.sum(), 1, generator=generator)
        return int(order[choice])
    return int(torch.multinomial(probs, 1, generator=generator))
