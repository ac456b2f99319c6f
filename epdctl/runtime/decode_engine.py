"""Continuous-batching decode: every running sequence advances with ONE batched forward per step.

Sequences of different lengths share a step through left padding: each sequence's KV is
right-aligned in a [B, heads, L_max, dim] cache, padding columns are masked out and each row
gets its own M-RoPE position (its cache length + its rope_delta), so a sequence's tokens do not
depend on who it is batched with. Per-sequence KV lives in preallocated buffers sized for
prompt + max_tokens, so a step copies but never reallocates.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from .errors import RuntimeWorkerError
from .model import ModelBundle
from .prefill_engine import PrefillResult
from .sampling import SamplingParams, sample, token_generator

log = logging.getLogger(__name__)


@dataclass
class _Seq:
    seq_id: str
    params: SamplingParams
    keys: list[torch.Tensor]      # per layer [heads, capacity, dim]
    values: list[torch.Tensor]
    length: int                   # tokens held in the KV buffers
    rope_delta: int
    last_token: int
    generated: int = 1            # the prefill's first token counts
    fresh: bool = True            # first token not yet emitted
    logits: list[torch.Tensor] = field(default_factory=list)


class DecodeEngine:
    def __init__(self, bundle: ModelBundle, max_running: int = 64, keep_logits: bool = False):
        inner = bundle.model.model
        if getattr(inner, "language_model", None) is None:
            raise ValueError("DecodeEngine needs a bundle loaded with the language model (decode/colocated)")
        self.bundle = bundle
        self.lm = inner.language_model
        self.lm_head = bundle.model.lm_head
        self.text_config = bundle.config.text_config
        self.max_running = max_running
        self.keep_logits = keep_logits
        self._finished_logits: dict[str, list[torch.Tensor]] = {}
        self._seqs: dict[str, _Seq] = {}
        self.steps = 0
        self.forward_passes = 0

    @property
    def num_running(self) -> int:
        return len(self._seqs)

    def add(self, seq_id: str, result: PrefillResult, params: SamplingParams) -> None:
        """Take over a sequence after prefill; its first token is emitted by the next ``step()``."""
        if seq_id in self._seqs:
            raise RuntimeWorkerError(f"sequence {seq_id!r} is already running")
        if len(self._seqs) >= self.max_running:
            raise RuntimeWorkerError(f"decode is full ({self.max_running} running sequences)")
        if len(result.kv) != self.text_config.num_hidden_layers:
            raise RuntimeWorkerError(f"KV has {len(result.kv)} layers, the model {self.text_config.num_hidden_layers}; "
                                     "prefill and decode must load the same checkpoint")
        n = int(result.kv[0][0].shape[2])
        cap = n + max(int(params.max_tokens), 1)
        keys, values = [], []
        for k, v in result.kv:
            kb = torch.empty(k.shape[1], cap, k.shape[3], dtype=self.bundle.dtype)
            vb = torch.empty(v.shape[1], cap, v.shape[3], dtype=self.bundle.dtype)
            kb[:, :n] = k[0]
            vb[:, :n] = v[0]
            keys.append(kb)
            values.append(vb)
        seq = _Seq(seq_id, params, keys, values, n, int(result.rope_delta), int(result.first_token))
        if self.keep_logits:
            seq.logits.append(result.first_logits.float().clone())
        self._seqs[seq_id] = seq

    def abort(self, seq_id: str) -> None:
        """Stop a sequence and free its KV (unknown ids are ignored)."""
        self._seqs.pop(seq_id, None)
        self._finished_logits.pop(seq_id, None)

    def _finished(self, seq: _Seq, token: int) -> bool:
        stops = set(seq.params.stop_token_ids)
        if not seq.params.ignore_eos:
            stops |= set(self.bundle.eos_token_ids)
        return token in stops or seq.generated >= seq.params.max_tokens

    def step(self) -> list[tuple[str, int, bool]]:
        """(seq_id, new_token, finished) for every running sequence; finished ones are freed."""
        self.steps += 1
        out: list[tuple[str, int, bool]] = []
        active: list[_Seq] = []
        for seq in list(self._seqs.values()):
            if seq.fresh:
                seq.fresh = False
                done = self._finished(seq, seq.last_token)
                out.append((seq.seq_id, seq.last_token, done))
                if done:
                    self._finish(seq)
            else:
                active.append(seq)
        if active:
            for seq, token in zip(active, self._forward(active)):
                seq.last_token = token
                seq.generated += 1
                done = self._finished(seq, token)
                out.append((seq.seq_id, token, done))
                if done:
                    self._finish(seq)
        return out

    def _finish(self, seq: _Seq) -> None:
        del self._seqs[seq.seq_id]
        if self.keep_logits:
            self._finished_logits[seq.seq_id] = seq.logits

    def pop_logits(self, seq_id: str) -> list[torch.Tensor]:
        """Logits of every token of a finished sequence (``keep_logits=True`` only; for exactness checks)."""
        return self._finished_logits.pop(seq_id, [])

    @torch.inference_mode()
    def _forward(self, seqs: list[_Seq]) -> list[int]:
        self.forward_passes += 1
        b = len(seqs)
        lmax = max(s.length for s in seqs)
        n_layers = len(seqs[0].keys)
        heads, dim = seqs[0].keys[0].shape[0], seqs[0].keys[0].shape[2]
        mask = torch.zeros(b, lmax + 1, dtype=torch.long)
        data = []
        for layer in range(n_layers):
            kb = torch.zeros(b, heads, lmax, dim, dtype=self.bundle.dtype)
            vb = torch.zeros(b, heads, lmax, dim, dtype=self.bundle.dtype)
            for i, s in enumerate(seqs):
                kb[i, :, lmax - s.length:] = s.keys[layer][:, :s.length]
                vb[i, :, lmax - s.length:] = s.values[layer][:, :s.length]
            data.append((kb, vb))
        for i, s in enumerate(seqs):
            mask[i, lmax - s.length:] = 1
        cache = DynamicCache(ddp_cache_data=data, config=self.text_config)
        ids = torch.tensor([[s.last_token] for s in seqs], dtype=torch.long)
        pos = torch.tensor([s.length + s.rope_delta for s in seqs], dtype=torch.long).view(1, b, 1).expand(3, b, 1)
        embeds = self.lm.embed_tokens(ids)
        out = self.lm(inputs_embeds=embeds, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
        logits = self.lm_head(out.last_hidden_state[:, -1]).float()
        for layer_idx, layer in enumerate(cache.layers):
            for i, s in enumerate(seqs):
                s.keys[layer_idx][:, s.length] = layer.keys[i, :, -1]
                s.values[layer_idx][:, s.length] = layer.values[i, :, -1]
        tokens = []
        for i, s in enumerate(seqs):
            s.length += 1
            if self.keep_logits:
                s.logits.append(logits[i].clone())
            tokens.append(sample(logits[i], s.params, token_generator(s.params, s.generated)))
        return tokens
