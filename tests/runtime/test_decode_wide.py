"""Wide decode steps: oneDNN-packed MLP/lm_head GEMMs and the step's thread count, checked against
the plain path and against each sequence decoded alone (tokens equal, logits within 1e-4)."""

from __future__ import annotations

import pytest
import torch

from test_engine import prefill_request, run_alone

from epdctl.runtime.fast import packed_gemm
from epdctl.runtime.fast.decode import FastDecodeEngine as DecodeEngine
from epdctl.runtime.fast.decode_threads import POOL_MIN_MACS, StepThreads, macs_per_row
from epdctl.runtime.encoder_engine import VisionEncoder
from epdctl.runtime.sampling import SamplingParams

needs_onednn = pytest.mark.skipif(not packed_gemm.available(), reason="torch built without oneDNN")


@needs_onednn
@pytest.mark.parametrize("rows", [1, 8, 16, 33])
def test_packed_mlp_and_head_equal_the_modules(bundle, rows):
    lm = bundle.model.model.language_model
    packed = packed_gemm.packed_for(lm, bundle.model.lm_head)
    assert packed is not None and len(packed.packed) == len(lm.layers)
    x = torch.randn(rows, 1, lm.config.hidden_size, generator=torch.Generator().manual_seed(rows))
    with torch.inference_mode():
        mlp = lm.layers[0].mlp
        want = mlp(x)
        with packed.installed():
            got = mlp(x)  # the module's own call runs the packed forward while installed
        assert mlp(x).equal(want)  # and the class's forward again afterwards
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5)
        assert torch.allclose(packed.lm_head(x[:, 0]), bundle.model.lm_head(x[:, 0]), atol=1e-5)


@needs_onednn
def test_no_packed_copy_for_a_model_too_big_to_copy(bundle):
    lm = bundle.model.model.language_model
    assert packed_gemm.packed_for(lm, bundle.model.lm_head, max_copy_bytes=1024) is None


def test_packed_mlp_refuses_a_biased_gate():
    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_proj = torch.nn.Linear(8, 16, bias=True)
            self.up_proj = torch.nn.Linear(8, 16, bias=False)
            self.down_proj = torch.nn.Linear(16, 8, bias=False)
            self.act_fn = torch.nn.SiLU()

    with pytest.raises(ValueError, match="bias-free"):
        packed_gemm.PackedMLP(Mlp())


def test_step_threads_use_the_pool_only_for_big_steps():
    small = StepThreads(macs_per_row=1_500_000)  # the tiny model's size class
    assert [small.wanted(n, 2) for n in (1, 16, 45)] == [1, 1, 2]
    assert StepThreads(macs_per_row=POOL_MIN_MACS).wanted(1, 4) == 4  # a real model: one row fills it
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with small.applied(4) as used:
            assert used == 1 and torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError):
            with small.applied(4):
                raise RuntimeError("a failed step")
        assert torch.get_num_threads() == 2  # restored after a failure too
    finally:
        torch.set_num_threads(before)


def test_wide_batch_equals_each_alone_and_runs_on_one_thread(bundle, images):
    """More rows than packed_gemm.MIN_ROWS: the packed path; every sequence as if decoded alone."""
    enc = VisionEncoder(bundle)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    n = packed_gemm.MIN_ROWS + 2
    results = [prefill_request(bundle, enc, images[:i % 4], f"describe image {i}", params) for i in range(n)]
    engine = DecodeEngine(bundle, keep_logits=True)
    assert engine.threads.macs_per_row == macs_per_row(engine.lm, engine.lm_head)
    seen_threads: list[int] = []
    lm_forward, lean = engine.lm.forward, engine.lean  # whichever forward the step runs (decode_forward.py)
    engine.lm.forward = lambda *a, **k: (seen_threads.append(torch.get_num_threads()), lm_forward(*a, **k))[1]
    if lean is not None:
        engine.lean = lambda *a: (seen_threads.append(torch.get_num_threads()), lean(*a))[1]  # type: ignore
    for i, r in enumerate(results):
        engine.add(f"s{i}", r, params)
    tokens: dict[str, list[int]] = {f"s{i}": [] for i in range(n)}
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        while engine.num_running:
            for sid, tok, _ in engine.step():
                tokens[sid].append(tok)
        assert torch.get_num_threads() == 2  # the pool is back after every step
    finally:
        torch.set_num_threads(before)
        del engine.lm.forward
    assert seen_threads and set(seen_threads) == {1}  # the tiny model's steps stay on one thread
    for i, r in enumerate(results):
        alone_tokens, alone_logits = run_alone(bundle, r, params)
        assert tokens[f"s{i}"] == alone_tokens
        batched = engine.pop_logits(f"s{i}")
        assert max(float((a - b).abs().max()) for a, b in zip(batched, alone_logits)) < 1e-4
