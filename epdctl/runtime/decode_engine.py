"""Continuous-batching decode: every running sequence advances with ONE batched forward per step.

Each sequence's KV lives in a persistent slot (kv_slots.py): added once when it joins, extended
by one column per step in place, so a step costs one forward over a view of the running slots,
never a rebuild of a padded batch. Rows of different lengths share the step under a mask that
hides each row's unused columns, and each row gets its own M-RoPE position (its length + its
rope_delta), so a sequence's tokens do not depend on who it is batched with. A new sequence
joins the running batch at the next step. Every row is sampled in one batched call (greedy
or temperature/top-p, seeded or not) with one device-to-host copy per step. The step runs
through the model's own modules with SDPA attention under an additive mask; the fast path
(fast/decode.py) replaces the step's forward and leaves the bookkeeping here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from .errors import RuntimeWorkerError
from .kv_slots import KVSlots, SlotCache, additive_mask
from .model import ModelBundle
from .prefill_engine import PrefillResult
from .sampling import SamplingParams, sample_batch

log = logging.getLogger(__name__)


@dataclass
class _Seq:
    seq_id: str
    params: SamplingParams
    stops: frozenset[int]
    rope_delta: int
    last_token: int
    slot: int = -1                # -1 until its first token was emitted and it joined the batch
    generated: int = 1            # the prefill's first token counts
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
        self._fresh: dict[str, tuple[_Seq, PrefillResult]] = {}
        tc = self.text_config
        head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
        self.slots = KVSlots(tc.num_hidden_layers, tc.num_key_value_heads, head_dim, bundle.dtype)
        self._by_slot: list[_Seq] = []
        self._tokens = torch.zeros(4, dtype=torch.long)  # per slot: the token the next step feeds (its last)
        self._deltas = torch.zeros(4, dtype=torch.long)  # per slot: the sequence's M-RoPE delta
        self._sampled = 0  # running rows that sample (temperature > 0); 0: the step takes the argmax only
        self.steps = 0
        self.forward_passes = 0

    @property
    def num_running(self) -> int:
        return len(self._seqs)

    def add(self, seq_id: str, result: PrefillResult, params: SamplingParams) -> None:
        """Take over a sequence after prefill; the next ``step()`` emits its first token and, in the
        same step, decodes its second in the running batch."""
        if seq_id in self._seqs:
            raise RuntimeWorkerError(f"sequence {seq_id!r} is already running")
        if len(self._seqs) >= self.max_running:
            raise RuntimeWorkerError(f"decode is full ({self.max_running} running sequences)")
        if len(result.kv) != self.text_config.num_hidden_layers:
            raise RuntimeWorkerError(f"KV has {len(result.kv)} layers, the model {self.text_config.num_hidden_layers}; "
                                     "prefill and decode must load the same checkpoint")
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.bundle.eos_token_ids))
        seq = _Seq(seq_id, params, frozenset(stops), int(result.rope_delta), int(result.first_token))
        if self.keep_logits:
            seq.logits.append(result.first_logits.float().clone())
        self._seqs[seq_id] = seq
        self._fresh[seq_id] = (seq, result)

    def abort(self, seq_id: str) -> None:
        """Stop a sequence and free its KV (unknown ids are ignored)."""
        seq = self._seqs.pop(seq_id, None)
        self._fresh.pop(seq_id, None)
        self._finished_logits.pop(seq_id, None)
        if seq is not None and seq.slot >= 0:
            self._release(seq)

    def _finished(self, seq: _Seq, token: int) -> bool:
        return token in seq.stops or seq.generated >= seq.params.max_tokens

    def step(self) -> list[tuple[str, int, bool]]:
        """(seq_id, new_token, finished) for every running sequence; finished ones are freed."""
        self.steps += 1
        out: list[tuple[str, int, bool]] = []
        fresh, self._fresh = list(self._fresh.values()), {}
        joining = [(s, r) for s, r in fresh if not self._finished(s, s.last_token)]
        if joining:  # one reallocation of the slot tables for every sequence joining this step
            self.slots.reserve(self.slots.used + len(joining),
                               max(int(r.kv[0][0].shape[2]) + max(s.params.max_tokens, 1) for s, r in joining))
        for seq, result in fresh:  # emit the prefill's token; the sequence joins this step's batch
            done = self._finished(seq, seq.last_token)
            out.append((seq.seq_id, seq.last_token, done))
            if done:
                self._finish(seq)
            else:
                self._join(seq, result)
        batch = list(self._by_slot)
        if batch:
            for seq, token in zip(batch, self._forward(len(batch))):
                seq.last_token = token
                seq.generated += 1
                done = self._finished(seq, token)
                out.append((seq.seq_id, token, done))
                if done:
                    self._finish(seq)
        return out

    def _join(self, seq: _Seq, result: PrefillResult) -> None:
        seq.slot = self.slots.add(seq.seq_id, result.kv, seq.params.max_tokens)
        self._by_slot.append(seq)
        if seq.slot >= len(self._tokens):
            grow = torch.zeros(2 * len(self._tokens), dtype=torch.long)
            self._tokens = torch.cat([self._tokens, grow])
            self._deltas = torch.cat([self._deltas, grow])
        self._tokens[seq.slot] = seq.last_token
        self._deltas[seq.slot] = seq.rope_delta
        self._sampled += seq.params.temperature > 0

    def _finish(self, seq: _Seq) -> None:
        del self._seqs[seq.seq_id]
        if seq.slot >= 0:
            self._release(seq)
        if self.keep_logits:
            self._finished_logits[seq.seq_id] = seq.logits

    def _release(self, seq: _Seq) -> None:
        slot, seq.slot = seq.slot, -1
        self._sampled -= seq.params.temperature > 0
        last = self._by_slot.pop()
        self.slots.free(slot)
        if last is not seq:
            self._tokens[slot] = self._tokens[last.slot]
            self._deltas[slot] = self._deltas[last.slot]
            self._by_slot[slot] = last
            last.slot = slot

    def pop_logits(self, seq_id: str) -> list[torch.Tensor]:
        """Logits of every token of a finished sequence (``keep_logits=True`` only; for exactness checks)."""
        return self._finished_logits.pop(seq_id, [])

    def _forward(self, n: int) -> list[int]:
        """One batched step of the first ``n`` slots (the sequences in ``_by_slot``)."""
        self.forward_passes += 1
        return self._step_rows(n)

    @torch.inference_mode()
    def _step_rows(self, n: int) -> list[int]:
        seqs = self._by_slot[:n]
        cache = self._cache(n)
        ids = self._tokens[:n].view(n, 1)
        pos = (cache.cols + self._deltas[:n]).view(1, n, 1).expand(3, n, 1)
        logits = self._logits(ids, pos, cache)
        for i in range(n):
            self.slots.lengths[i] += 1
        if self.keep_logits:
            for i, s in enumerate(seqs):
                s.logits.append(logits[i].clone())
        return self._sample(logits, seqs)

    def _cache(self, n: int) -> SlotCache:
        return SlotCache(self.slots, n)

    def _sample(self, logits: torch.Tensor, seqs: list[_Seq]) -> list[int]:
        """Every row's next token; it becomes the row's input to the next step."""
        tokens = sample_batch(logits, [s.params for s in seqs], [s.generated for s in seqs])
        self._tokens[:len(seqs)] = torch.tensor(tokens, dtype=torch.long)
        return tokens

    def _logits(self, ids: torch.Tensor, pos: torch.Tensor, cache: SlotCache) -> torch.Tensor:
        """The step through the model's own modules: ids [n, 1], positions [3, n, 1]; logits [n, vocab]."""
        mask = {"full_attention": additive_mask(cache.cols, cache.width, self.bundle.dtype)}
        out = self.lm(inputs_embeds=self.lm.embed_tokens(ids), attention_mask=mask, position_ids=pos, cache=cache,
                      use_cache=True)
        return self.lm_head(out.last_hidden_state[:, -1]).float()
