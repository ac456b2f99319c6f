"""The decode engine's per-row state kept as tensors across steps (each slot's next token and
M-RoPE delta, moved with the slot), the native argmax of all-greedy steps, and one slot-table
reallocation for a step's joiners: tokens stay those of each sequence decoded alone."""

from __future__ import annotations

import pytest
import torch

from test_engine import prefill_request, run_alone

from epdctl.runtime.fast.decode import FastDecodeEngine as DecodeEngine
from epdctl.runtime.encoder_engine import VisionEncoder
from epdctl.runtime.kv_slots import KVSlots
from epdctl.runtime.fast import native_attention
from epdctl.runtime.fast.decode import argmax_into
from epdctl.runtime.sampling import SamplingParams


@pytest.fixture
def dll(monkeypatch):
    """The native library, built even where EPDCTL_NATIVE_ATTENTION=0 turns it off for the engine
    (scripts/test.sh installs the compiler)."""
    monkeypatch.delenv("EPDCTL_NATIVE_ATTENTION", raising=False)
    monkeypatch.setattr(native_attention, "_state", {})
    lib = native_attention.kernel()
    assert lib is not None, "the native library did not build: install gcc (scripts/test.sh does)"
    return lib


@pytest.mark.parametrize("rows", [1, 3, 16])
def test_native_argmax_equals_torch(dll, rows):
    g = torch.Generator().manual_seed(rows)
    logits = torch.randn(rows, 373, generator=g)
    logits[0, 5] = logits[0, 300] = logits[0].max() + 1  # a tie: the first index wins
    if rows > 1:
        logits[1, 17] = float("nan")  # a NaN wins, as in torch
        logits[1, 40] = float("inf")
    if rows > 2:
        logits[2] = float("-inf")
    out = torch.empty(rows, dtype=torch.long)
    assert argmax_into(dll, logits, out) == torch.argmax(logits, dim=-1).tolist()
    assert out.tolist() == torch.argmax(logits, dim=-1).tolist()


def test_native_argmax_refuses_what_it_cannot_read(dll):
    with pytest.raises(ValueError, match="contiguous fp32"):
        argmax_into(dll, torch.randn(4, 8).t(), torch.empty(8, dtype=torch.long))
    with pytest.raises(ValueError, match="int64"):
        argmax_into(dll, torch.randn(4, 8), torch.empty(4, dtype=torch.int32))


@pytest.mark.parametrize("native", [True, False])
def test_mixed_rows_joining_and_finishing_out_of_order_equal_each_alone(bundle, images, native):
    enc = VisionEncoder(bundle)
    specs = [(1, 7, 0.0), (3, 4, 1.2), (2, 9, 0.0), (4, 3, 0.0), (1, 6, 0.9), (2, 5, 0.0)]
    params = [SamplingParams(max_tokens=n, temperature=t, top_p=0.9, seed=i if t else None, ignore_eos=True)
              for i, (_, n, t) in enumerate(specs)]
    results = [prefill_request(bundle, enc, images[i:i + k], "describe the image", p)
               for i, ((k, _, _), p) in enumerate(zip(specs, params))]
    engine = DecodeEngine(bundle)
    if not native:
        engine.native = None
    got: dict[str, list[int]] = {f"s{i}": [] for i in range(len(specs))}
    for i in range(3):
        engine.add(f"s{i}", results[i], params[i])
    step = 0
    while engine.num_running or step < 3:
        if step in (1, 2):  # the rest join while the first ones run (one, then two at once)
            for i in ([3] if step == 1 else [4, 5]):
                engine.add(f"s{i}", results[i], params[i])
        for sid, tok, _ in engine.step():
            got[sid].append(tok)
        assert all(s.slot == i for i, s in enumerate(engine._by_slot))
        assert engine._sampled == sum(s.params.temperature > 0 for s in engine._by_slot)
        step += 1
    for i, p in enumerate(params):
        alone, _ = run_alone(bundle, results[i], p)
        assert got[f"s{i}"] == alone and len(alone) == p.max_tokens


def test_a_steps_joiners_reallocate_the_slot_tables_once(bundle, images):
    enc = VisionEncoder(bundle)
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    result = prefill_request(bundle, enc, images[:2], "describe the image", params)
    engine = DecodeEngine(bundle)
    old = engine.slots
    engine.slots = KVSlots(len(old.keys), *old.shape, old.dtype, slots=2, capacity=1)
    tables = []
    grow = engine.slots._grow

    def counting(slots: int, capacity: int) -> None:
        before = engine.slots.keys[0]
        grow(slots, capacity)
        if engine.slots.keys[0] is not before:
            tables.append((slots, capacity))

    engine.slots._grow = counting  # type: ignore[method-assign]
    for i in range(9):
        engine.add(f"s{i}", result, params)
    engine.step()
    assert len(tables) == 1 and tables[0][0] == 16 and engine.slots.used == 9
    while engine.num_running:
        engine.step()
