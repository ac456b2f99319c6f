"""The decode step's plain-torch forward (decode_forward.py) against the model's own modules: the
same logits bit for bit, for 1-row, mixed-length and packed (MIN_ROWS+) steps, and joins."""

from __future__ import annotations

import pytest
import torch

from test_engine import prefill_request

from epdctl.runtime.fast import decode_forward, packed_gemm
from epdctl.runtime.fast.decode import FastDecodeEngine as DecodeEngine
from epdctl.runtime.encoder_engine import VisionEncoder
from epdctl.runtime.fast.native_attention import kernel
from epdctl.runtime.sampling import SamplingParams

needs_native = pytest.mark.skipif(kernel() is None, reason="no C compiler for the native attention")


@needs_native
@pytest.mark.parametrize("rows", [1, 3, packed_gemm.MIN_ROWS + 1])
def test_lean_step_equals_the_module_step_bit_for_bit(bundle, images, rows):
    enc = VisionEncoder(bundle)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    results = [prefill_request(bundle, enc, images[i % 5:i % 5 + 1 + i % 3], "describe the image", params)
               for i in range(rows)]
    lean, modules = DecodeEngine(bundle, keep_logits=True), DecodeEngine(bundle, keep_logits=True)
    assert lean.lean is not None
    modules.lean = None
    for engine in (lean, modules):
        for i, r in enumerate(results[:-1]):
            engine.add(f"s{i}", r, params)
    steps = 0
    while lean.num_running or steps < 3:
        if steps == 2:  # one joins mid-flight
            for engine in (lean, modules):
                engine.add("late", results[-1], params)
        assert lean.step() == modules.step()
        steps += 1
    assert modules.num_running == 0
    for sid in [f"s{i}" for i in range(rows - 1)] + ["late"]:
        got, want = lean.pop_logits(sid), modules.pop_logits(sid)
        assert len(got) == len(want) == params.max_tokens
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_lean_forward_only_for_what_it_was_written_for(bundle):
    lm, head = bundle.model.model.language_model, bundle.model.lm_head
    native = kernel()
    assert decode_forward.lean_for(lm, head, None, torch.float32) is None  # no C attention
    assert decode_forward.lean_for(lm, head, native, torch.bfloat16) is None
    if native is not None:
        assert decode_forward.lean_for(lm, head, native, torch.float32) is not None
        assert decode_forward.lean_for(torch.nn.Linear(2, 2), head, native, torch.float32) is None


@needs_native
def test_no_lean_forward_where_the_fused_gemm_changes_the_bits(bundle, monkeypatch):
    """On a host whose BLAS reduces a wider GEMM in another order, the decode keeps the modules'
    path (tokens must equal it): simulated by a linear that rounds differently for the fused width."""
    lm, head = bundle.model.model.language_model, bundle.model.lm_head
    native = kernel()
    assert decode_forward.fuses_exactly(lm.layers[0])  # this host: the same bits
    attn = lm.layers[0].self_attn
    fused_width = attn.q_proj.out_features + attn.k_proj.out_features + attn.v_proj.out_features
    real = torch.nn.functional.linear

    def other_blas(x, w, b=None):
        out = real(x, w, b)
        return out + 1e-7 * out if w.shape[0] == fused_width else out

    monkeypatch.setattr(decode_forward.F, "linear", other_blas)
    assert not decode_forward.fuses_exactly(lm.layers[0])
    assert decode_forward.lean_for(lm, head, native, torch.float32) is None


def test_the_check_covers_every_width_the_engine_can_step() -> None:
    assert decode_forward.check_widths(64) == list(range(1, 65))  # the runtime's default batch
    assert decode_forward.check_widths(5) == [1, 2, 3, 4, 5]
    assert decode_forward.check_widths(300) == list(range(1, 65)) + [128, 256, 300]


@needs_native
def test_a_width_between_the_old_samples_is_checked_too(bundle, monkeypatch):
    """A BLAS that changes the fused GEMM's bits only at 40 rows (a width the engine may step but
    the first check never tried) keeps the decode on the modules' path; an engine that never runs
    more than 32 sequences can still take the lean forward."""
    lm, head = bundle.model.model.language_model, bundle.model.lm_head
    native = kernel()
    attn = lm.layers[0].self_attn
    fused_width = attn.q_proj.out_features + attn.k_proj.out_features + attn.v_proj.out_features
    real = torch.nn.functional.linear

    def other_blas_at_40(x, w, b=None):
        out = real(x, w, b)
        return out + 1e-7 * out if w.shape[0] == fused_width and x.shape[0] == 40 else out

    monkeypatch.setattr(decode_forward.F, "linear", other_blas_at_40)
    assert decode_forward.lean_for(lm, head, native, torch.float32) is None
    assert decode_forward.lean_for(lm, head, native, torch.float32, max_rows=32) is not None
    assert DecodeEngine(bundle, max_running=32).lean is not None
    assert DecodeEngine(bundle, max_running=64).lean is None
