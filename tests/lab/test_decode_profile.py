"""lab/benchmarks/profile_decode_step.py: its timers must see every part of a real decode step.

A transformers upgrade that stopped routing the decode's GEMMs through ``F.linear`` or its
attention through the registered slot attention would silently make the profile's split
meaningless; this checks the split on the tiny model and the line fit on exact data.
"""

from __future__ import annotations

import pytest
import torch

import profile_decode_step as prof

from epdctl.runtime.encoder_engine import VisionEncoder
from epdctl.runtime.prefill_engine import LanguagePrefill
from epdctl.runtime.prompt import build_prompt
from epdctl.runtime.sampling import SamplingParams
from tiny_model import image_messages


def test_fit_recovers_a_line():
    a, b = prof.fit([1, 2, 4, 8, 16], [0.5 + 0.03 * n for n in (1, 2, 4, 8, 16)])
    assert a == pytest.approx(0.5) and b == pytest.approx(0.03)


def test_split_sees_every_part_of_a_step(bundle, images):
    enc, pre = VisionEncoder(bundle), LanguagePrefill(bundle)
    params = SamplingParams(max_tokens=8)
    results = []
    for i in range(4):
        encoded = enc.encode(images[i:i + 1 + i % 2])
        prompt = build_prompt(bundle, image_messages(len(encoded)), [e.grid_thw for e in encoded])
        results.append(pre.prefill(prompt, encoded, params))
    for n in (1, 4):
        parts = prof.split_pass(bundle, results, n, steps=4)
        assert set(parts) == set(prof.PARTS)
        for key in ("gemm", "attention", "kv_write", "rest_of_forward", "engine"):
            assert parts[key] > 0, (n, parts)
    # the timers were removed again: a plain engine runs the unwrapped functions
    engine = prof.engine_with(bundle, results, 1, 4)
    assert "forward" not in vars(engine.lm) and "forward" not in vars(engine.lm_head)
    assert torch.nn.functional.linear is torch._C._nn.linear
    assert prof.slot_attention.AttentionInterface._global_mapping[prof.slot_attention.NAME] is \
        prof.slot_attention.slot_attention


def _results(bundle, images, count: int) -> list:
    enc, pre = VisionEncoder(bundle), LanguagePrefill(bundle)
    out = []
    for i in range(count):
        encoded = enc.encode(images[i % 4:i % 4 + 1])
        prompt = build_prompt(bundle, image_messages(len(encoded)), [e.grid_thw for e in encoded])
        out.append(pre.prefill(prompt, encoded, SamplingParams(max_tokens=8)))
    return out


def test_split_sees_the_packed_gemms_of_a_wide_step(bundle, images):
    results = _results(bundle, images, prof.packed_gemm.MIN_ROWS)
    engine = prof.engine_with(bundle, results, len(results), 4)
    assert engine.packed is not None, "the pinned torch (2.13.0 CPU) has oneDNN; this one does not"
    parts = prof.split_pass(bundle, results, len(results), steps=4)
    assert parts["gemm"] > 0 and parts["attention"] > 0 and parts["rest_of_forward"] > 0
    assert prof.packed_gemm._linear.__name__ == "_linear"  # unwrapped again


def test_op_table_names_the_ops_that_grow_with_the_batch(bundle, images):
    rows = prof.op_table(bundle, _results(bundle, images, 16), steps=2, rounds=1)
    ops = {r["op"]: r for r in rows}
    gemm = ops["mkldnn::_linear_pointwise"]  # oneDNN's packed GEMMs: wide steps only
    assert gemm["calls_16"] > 0 == gemm["calls_1"] and gemm["us_per_stream"] > 0
    assert "aten::bmm" not in ops  # attention runs in native_attention's C loop, no torch op
    assert rows == sorted(rows, key=lambda r: -r["us_per_stream"])
