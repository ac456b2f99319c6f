"""The fast decode step: ``DecodeEngine``'s bookkeeping with a faster forward on CPU.

What changes against the reference step (decode_engine.py), each where it applies:
- the intra-op pool only for steps whose GEMMs are big enough to pay for it (decode_threads.py);
- wide steps run the MLPs and lm_head through oneDNN with prepacked weights (packed_gemm.py);
- attention and the slots' K/V writes as small C loops built on this host (native_attention.py),
  and the argmax of an all-greedy step in C;
- for the tiny fp32 Qwen2-VL models the forward as plain torch calls without the modules
  (decode_forward.py), used only where its fused GEMMs give the separate GEMMs' bits.

At load the engine runs one probe step of random rows through both forwards and keeps the fast
one only when every row's greedy token is the reference's and the logits agree to fp32 rounding
(``LOGIT_TOLERANCE``); else it logs why and runs the reference step.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging

import torch

from ..decode_engine import DecodeEngine, _Seq
from ..kv_slots import KVSlots, SlotCache, additive_mask
from ..model import ModelBundle
from .decode_forward import lean_for
from .decode_threads import StepThreads, macs_per_row
from .native_attention import RowLengths, kernel, write
from .packed_gemm import MIN_ROWS, packed_for
from .slot_attention import use_for

log = logging.getLogger(__name__)

PROBE_LENGTHS = (3, 8, 17, 30)  # prompt lengths of the load-time probe step's rows
# The C attention and oneDNN GEMMs sum in another order than SDPA and MKL: the step's logits
# agree with the reference to fp32 rounding, not bit for bit (the fused GEMMs alone are checked
# bit for bit, decode_forward.fuses_exactly). More than this, relative to the largest logit,
# is a defect, and the engine keeps the reference step.
LOGIT_TOLERANCE = 1e-4


class NativeSlotCache(SlotCache):
    """A SlotCache whose K/V writes go through native_attention's C loop."""

    def __init__(self, slots: KVSlots, n: int, native: ctypes.CDLL):
        self.slots = slots
        self.n = n
        self.native = native
        self.cols = torch.tensor(slots.lengths[:n], dtype=torch.long)
        self.width = max(slots.lengths[:n]) + 1

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: object,
               **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.slots.keys[layer_idx], self.slots.values[layer_idx]
        write(self.native, key_states, value_states, k, v, self.cols)
        return k[:self.n, :, :self.width], v[:self.n, :, :self.width]


def argmax_into(dll: ctypes.CDLL, logits: torch.Tensor, out: torch.Tensor) -> list[int]:
    """Greedy tokens of every row: ``out[:] = logits.argmax(-1)`` through native_attention's library,
    as a list. logits: contiguous fp32 [n, vocab]; out: contiguous int64 [n]. Same tokens as
    ``sampling.sample_batch``."""
    n, vocab = logits.shape
    if not (logits.is_contiguous() and logits.dtype == torch.float32 and out.dtype == torch.int64
            and out.is_contiguous() and out.numel() == n):
        raise ValueError("native argmax needs contiguous fp32 logits [n, vocab] and an int64 [n] output")
    dll.epd_argmax_f32(n, vocab, logits.data_ptr(), out.data_ptr())
    return out.tolist()


class FastDecodeEngine(DecodeEngine):
    def __init__(self, bundle: ModelBundle, max_running: int = 64, keep_logits: bool = False):
        super().__init__(bundle, max_running, keep_logits)
        self.packed = packed_for(self.lm, self.lm_head)  # oneDNN GEMMs for steps of MIN_ROWS+ rows
        self.threads = StepThreads(macs_per_row(self.lm, self.lm_head))  # the pool only for big steps
        self.native = kernel() if bundle.dtype == torch.float32 else None  # C attention, else torch's
        self.lean = lean_for(self.lm, self.lm_head, self.native, bundle.dtype, max_running)  # no modules
        self.fast = True
        problem = self.probe()
        if problem:
            log.info("decode: the fast step differs from the reference step on this host (%s); "
                     "decode steps take the reference path", problem)
            self.fast = False

    def _forward(self, n: int) -> list[int]:
        if not self.fast:
            return super()._forward(n)
        self.forward_passes += 1
        with self.threads.applied(n):
            return self._step_rows(n)

    def _cache(self, n: int) -> SlotCache:
        if self.fast and self.native is not None:
            return NativeSlotCache(self.slots, n, self.native)
        return SlotCache(self.slots, n)

    def _logits(self, ids: torch.Tensor, pos: torch.Tensor, cache: SlotCache) -> torch.Tensor:
        if not self.fast:
            return super()._logits(ids, pos, cache)
        n = ids.shape[0]
        packed = self.packed if self.packed is not None and n >= MIN_ROWS else None
        if self.lean is not None and self.native is not None:  # (a test may turn the C attention off)
            return self.lean(ids, pos, cache, packed)
        mask = {"full_attention": RowLengths(cache.cols + 1, self.native) if self.native is not None
                else additive_mask(cache.cols, cache.width, self.bundle.dtype)}
        with use_for(self.lm.config), packed.installed() if packed else contextlib.nullcontext():
            out = self.lm(inputs_embeds=self.lm.embed_tokens(ids), attention_mask=mask, position_ids=pos, cache=cache,
                          use_cache=True)
        hidden = out.last_hidden_state[:, -1]
        return (packed.lm_head(hidden) if packed else self.lm_head(hidden)).float()

    def _sample(self, logits: torch.Tensor, seqs: list[_Seq]) -> list[int]:
        if self.fast and self._sampled == 0 and self.native is not None:  # all greedy: the argmax, into the ids
            return argmax_into(self.native, logits, self._tokens[:len(seqs)])
        return super()._sample(logits, seqs)

    @torch.inference_mode()
    def probe(self, rows: int = MIN_ROWS) -> str:
        """One step of ``rows`` random rows through the reference and the fast forward (module
        path, lean forward, packed GEMMs as the row count selects); what differs, or ''."""
        tc = self.text_config
        gen = torch.Generator().manual_seed(0)
        slots = KVSlots(tc.num_hidden_layers, self.slots.shape[0], self.slots.shape[1], self.bundle.dtype)
        for i in range(rows):
            n = PROBE_LENGTHS[i % len(PROBE_LENGTHS)]
            kv = [(torch.randn(1, *self.slots.shape[:1], n, self.slots.shape[1], generator=gen, dtype=self.bundle.dtype),
                   torch.randn(1, *self.slots.shape[:1], n, self.slots.shape[1], generator=gen, dtype=self.bundle.dtype))
                  for _ in range(tc.num_hidden_layers)]
            slots.add(f"probe-{i}", kv, 1)
        ids = torch.randint(0, int(self.lm_head.weight.shape[0]), (rows, 1), generator=gen)
        widths = sorted({1, rows})
        for n in widths:
            cols = torch.tensor(slots.lengths[:n], dtype=torch.long)
            pos = cols.view(1, n, 1).expand(3, n, 1)
            self.fast = False
            reference = super()._logits(ids[:n], pos, SlotCache(slots, n))
            self.fast = True
            got = self._logits(ids[:n], pos, self._cache_for(slots, n))
            if not torch.equal(reference.argmax(-1), got.argmax(-1)):
                return f"greedy tokens of a {n}-row step"
            drift = float((reference - got).abs().max())
            if drift > LOGIT_TOLERANCE * max(1.0, float(reference.abs().max())):
                return f"logits of a {n}-row step differ by {drift:.3g}"
        return ""

    def _cache_for(self, slots: KVSlots, n: int) -> SlotCache:
        return NativeSlotCache(slots, n, self.native) if self.native is not None else SlotCache(slots, n)
