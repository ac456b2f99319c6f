"""Batched sampling: one call for every running sequence, drawing what each row would draw alone.

The draws are checked against the distribution they must follow (softmax at the temperature,
renormalised over the top-p nucleus) with many rows in one call, and a 16-stream decode with
mixed greedy / temperature / top-p seeded requests is checked token by token
against each request decoded alone.
"""

from __future__ import annotations

import pytest
import torch

from tiny_model import image_messages

from epdctl.runtime.decode_engine import DecodeEngine
from epdctl.runtime.encoder_engine import VisionEncoder
from epdctl.runtime.prefill_engine import LanguagePrefill
from epdctl.runtime.prompt import build_prompt
from epdctl.runtime.sampling import SamplingParams, sample, sample_batch, seeded_uniform

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def frequencies(tokens: list[int], vocab: int) -> torch.Tensor:
    return torch.bincount(torch.tensor(tokens), minlength=vocab).double() / len(tokens)


def test_seeded_uniform_is_a_pure_function_of_seed_and_index():
    draws = [seeded_uniform(seed, i) for seed in range(50) for i in range(50)]
    assert all(0.0 <= u < 1.0 for u in draws)
    assert len(set(draws)) == len(draws)
    assert seeded_uniform(7, 3) == seeded_uniform(7, 3) != seeded_uniform(7, 4) != seeded_uniform(8, 3)
    assert seeded_uniform(-5, 2) == seeded_uniform(-5, 2)  # negative seeds are fine
    u = torch.tensor(draws)
    assert abs(float(u.mean()) - 0.5) < 0.02 and abs(float((u < 0.1).double().mean()) - 0.1) < 0.02


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 1.0), (1.3, 0.8), (1.0, 0.5)])
def test_draws_follow_the_tempered_nucleus(temperature, top_p):
    torch.manual_seed(0)
    n = 40_000
    params = SamplingParams(temperature=temperature, top_p=top_p)
    got = frequencies(sample_batch(LOGITS.expand(n, -1), [params] * n, [1] * n), len(LOGITS))
    probs = torch.softmax(LOGITS.double() / temperature, -1)
    order = torch.argsort(probs, descending=True)
    mass_before = torch.cumsum(probs[order], 0) - probs[order]
    nucleus = order[mass_before < top_p]
    want = torch.zeros_like(probs)
    want[nucleus] = probs[nucleus] / probs[nucleus].sum()
    assert torch.all(got[want == 0] == 0), "a token outside the top-p nucleus was drawn"
    assert float((got - want).abs().max()) < 0.012, (got, want)


def test_seeded_rows_follow_the_distribution_across_seeds():
    params = [SamplingParams(temperature=1.0, seed=s) for s in range(20_000)]
    got = frequencies(sample_batch(LOGITS.expand(len(params), -1), params, [3] * len(params)), len(LOGITS))
    assert float((got - torch.softmax(LOGITS.double(), -1)).abs().max()) < 0.015


def test_a_row_draws_the_same_in_any_batch():
    torch.manual_seed(1)
    logits = torch.randn(12, 50) * 3
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, seed=11),
              SamplingParams(temperature=1.4, top_p=0.7, seed=12), SamplingParams(temperature=0.5, top_p=0.9, seed=3)] * 3
    indices = list(range(5, 17))
    together = sample_batch(logits, params, indices)
    assert together == [sample(logits[i], params[i], indices[i]) for i in range(12)]
    assert together[0] == int(torch.argmax(logits[0]))
    reordered = list(reversed(range(12)))
    assert sample_batch(logits[reordered], [params[i] for i in reordered], [indices[i] for i in reordered]) == \
        [together[i] for i in reordered]


def test_sixteen_mixed_streams_decode_as_each_alone(bundle, images):
    enc, pre = VisionEncoder(bundle), LanguagePrefill(bundle)
    kinds = [SamplingParams(max_tokens=9, ignore_eos=True),
             SamplingParams(max_tokens=9, temperature=1.2, seed=5, ignore_eos=True),
             SamplingParams(max_tokens=9, temperature=0.8, top_p=0.85, seed=9, ignore_eos=True),
             SamplingParams(max_tokens=6, temperature=1.0, top_p=0.5, seed=2)]
    requests = []
    for i in range(16):
        params = kinds[i % len(kinds)]
        imgs = images[i % 5: i % 5 + 1 + i % 3]
        encoded = enc.encode(imgs)
        prompt = build_prompt(bundle, image_messages(len(imgs), "count the images"), [e.grid_thw for e in encoded])
        requests.append((pre.prefill(prompt, encoded, params), params))
    engine = DecodeEngine(bundle)
    batched: dict[str, list[int]] = {f"s{i}": [] for i in range(16)}
    for i, (result, params) in enumerate(requests):
        engine.add(f"s{i}", result, params)
        for sid, tok, _ in engine.step():  # streams join one per step, then all run together
            batched[sid].append(tok)
    while engine.num_running:
        for sid, tok, _ in engine.step():
            batched[sid].append(tok)
    for i, (result, params) in enumerate(requests):
        alone = DecodeEngine(bundle)
        alone.add("x", result, params)
        tokens: list[int] = []
        while alone.num_running:
            tokens += [t for _, t, _ in alone.step()]
        assert batched[f"s{i}"] == tokens, f"stream {i} ({params})"
