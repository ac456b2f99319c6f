"""Compute engines in one process: embedding cache, batched decode, sampling, input errors."""

from __future__ import annotations

import pytest
import torch

from tiny_model import decode_all, image_messages, reference_generate

from epdctl.runtime.decode_engine import DecodeEngine
from epdctl.runtime.embed_cache import EmbedCache
from epdctl.runtime.encoder_engine import VisionEncoder
from epdctl.runtime.errors import BadRequestError, RuntimeWorkerError
from epdctl.runtime.model import load_bundle
from epdctl.runtime.prefill_engine import LanguagePrefill
from epdctl.runtime.prompt import build_prompt
from epdctl.runtime.sampling import SamplingParams


def prefill_request(bundle, encoder, imgs, text, params):
    encoded = encoder.encode(imgs)
    prompt = build_prompt(bundle, image_messages(len(imgs), text), [e.grid_thw for e in encoded])
    return LanguagePrefill(bundle).prefill(prompt, encoded, params)


def run_alone(bundle, result, params) -> tuple[list[int], list[torch.Tensor]]:
    engine = DecodeEngine(bundle, keep_logits=True)
    engine.add("alone", result, params)
    tokens = []
    while engine.num_running:
        tokens += [t for _, t, _ in engine.step()]
    return tokens, engine.pop_logits("alone")


def test_cache_hit_is_identical_and_skips_vision_tower(bundle, images):
    enc = VisionEncoder(bundle, cache_mb=64)
    first = enc.encode(images[:3])
    passes = enc.stats["vision_passes"]
    assert passes == 1  # one batched pass for all three misses
    again = enc.encode([images[1], images[0], images[4]])
    assert [e.cached for e in again] == [True, True, False]
    assert torch.equal(again[0].embeds, first[1].embeds) and torch.equal(again[1].embeds, first[0].embeds)
    assert enc.stats["vision_passes"] == passes + 1  # only the new image went through the tower
    repeat = enc.encode(images[:3])
    assert all(e.cached for e in repeat) and enc.stats["vision_passes"] == passes + 1
    assert enc.stats["cache_hits"] == 5 and enc.stats["cache_misses"] == 4


def test_duplicate_images_in_one_call_encode_once(bundle, images):
    enc = VisionEncoder(bundle)
    out = enc.encode([images[0], images[0], images[1]])
    assert torch.equal(out[0].embeds, out[1].embeds) and enc.stats["cache_entries"] == 2


def test_batched_vision_pass_equals_single_image_passes(bundle, images):
    together = VisionEncoder(bundle, cache_mb=0).encode(images[:4])
    for i, enc_img in enumerate(together):
        alone = VisionEncoder(bundle, cache_mb=0).encode([images[i]])[0]
        assert alone.grid_thw == enc_img.grid_thw
        assert torch.allclose(alone.embeds, enc_img.embeds, atol=1e-5)


def test_embed_cache_lru_eviction_by_megabytes():
    cache = EmbedCache(capacity_mb=1)
    quarter = lambda: torch.zeros(256 * 1024 // 4, 1)  # noqa: E731  (256 KiB of float32)
    for name in "abcd":
        cache.put(name, quarter(), (1, 2, 2))
    assert len(cache) == 4 and cache.bytes == 1024 * 1024
    assert cache.get("a") is not None          # a is now most recently used
    cache.put("e", quarter(), (1, 2, 2))       # evicts b, the least recently used
    assert "b" not in cache and all(k in cache for k in "acde")
    assert cache.evictions == 1 and cache.bytes <= cache.capacity_bytes
    cache.put("huge", torch.zeros(2 * 1024 * 1024 // 4), (1, 2, 2))  # larger than the bound: not cached
    assert "huge" not in cache and len(cache) == 4


def test_encoder_cache_bound_is_respected(bundle, images):
    one = VisionEncoder(bundle).encode([images[0]])[0].embeds
    size_mb = one.numel() * one.element_size() / 2**20
    enc = VisionEncoder(bundle, cache_mb=size_mb * 2.5)
    enc.encode(images[:5])
    assert enc.stats["cache_bytes"] <= size_mb * 2.5 * 2**20 and enc.stats["cache_evictions"] >= 2
    assert enc.encode([images[4]])[0].cached and not enc.encode([images[0]])[0].cached


def test_decode_batch_of_different_lengths_equals_each_alone(bundle, images):
    enc = VisionEncoder(bundle)
    params = SamplingParams(max_tokens=10)
    cases = [(images[:1], "describe the image"), (images[1:5], "count the images"), (images[:8], "what colour"),
             ([], "describe the image")]
    results = [prefill_request(bundle, enc, imgs, text, params) for imgs, text in cases]
    assert len({r.prompt_len for r in results}) == len(results)
    engine = DecodeEngine(bundle, keep_logits=True)
    tokens = decode_all(engine, results, params)
    assert engine.forward_passes <= params.max_tokens  # one forward per step, not per sequence
    for i, r in enumerate(results):
        alone_tokens, alone_logits = run_alone(bundle, r, params)
        assert tokens[f"s{i}"] == alone_tokens
        batched = engine.pop_logits(f"s{i}")
        assert max(float((a - b).abs().max()) for a, b in zip(batched, alone_logits)) < 1e-4


def test_sequence_joining_mid_flight_matches_reference(bundle, images):
    enc = VisionEncoder(bundle)
    params = SamplingParams(max_tokens=8)
    early = prefill_request(bundle, enc, images[:2], "describe the image", params)
    late = prefill_request(bundle, enc, images[3:6], "count the images", params)
    engine = DecodeEngine(bundle)
    engine.add("early", early, params)
    got: dict[str, list[int]] = {"early": [], "late": []}
    for _ in range(3):
        for sid, tok, _ in engine.step():
            got[sid].append(tok)
    engine.add("late", late, params)
    while engine.num_running:
        for sid, tok, _ in engine.step():
            got[sid].append(tok)
    for sid, imgs, text in (("early", images[:2], "describe the image"), ("late", images[3:6], "count the images")):
        _, ref, _ = reference_generate(bundle, imgs, image_messages(len(imgs), text), params.max_tokens)
        assert got[sid] == ref


def test_seeded_sampling_is_reproducible_and_stops(bundle, images):
    enc = VisionEncoder(bundle)
    params = SamplingParams(max_tokens=12, temperature=1.5, top_p=0.9, seed=7)

    def sampled(p):
        r = prefill_request(bundle, enc, images[:2], "describe the image", p)
        return run_alone(bundle, r, p)[0]

    a, b = sampled(params), sampled(params)
    assert a == b and len(a) == 12
    other = sampled(SamplingParams(max_tokens=12, temperature=1.5, top_p=0.9, seed=8))
    assert other != a
    stop = a[3]
    stopped = sampled(SamplingParams(max_tokens=12, temperature=1.5, top_p=0.9, seed=7, stop_token_ids=[stop]))
    assert stopped == a[: a.index(stop) + 1]


def test_ignore_eos_runs_to_max_tokens(bundle, images):
    enc = VisionEncoder(bundle)
    params = SamplingParams(max_tokens=9, ignore_eos=True)
    tokens, _ = run_alone(bundle, prefill_request(bundle, enc, images[:1], "describe the image", params), params)
    assert len(tokens) == 9


def test_abort_frees_the_sequence(bundle, images):
    enc = VisionEncoder(bundle)
    params = SamplingParams(max_tokens=50)
    engine = DecodeEngine(bundle)
    engine.add("x", prefill_request(bundle, enc, images[:1], "describe the image", params), params)
    engine.step()
    engine.abort("x")
    assert engine.num_running == 0 and engine.step() == []


def test_undecodable_image_is_a_400_naming_the_image(bundle, images):
    with pytest.raises(BadRequestError) as info:
        VisionEncoder(bundle).encode([images[0], b"not an image"])
    assert info.value.status == 400 and "image 2" in info.value.message  # 1-based, as everywhere


def test_placeholder_count_mismatch_is_a_400(bundle):
    with pytest.raises(BadRequestError) as info:
        build_prompt(bundle, image_messages(2), [(1, 4, 4)])
    assert "2 image placeholder" in info.value.message


def test_missing_model_folder_is_a_clear_error(tmp_path):
    with pytest.raises(RuntimeWorkerError, match="not a directory"):
        load_bundle(str(tmp_path / "nope"), role="encoder")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(RuntimeWorkerError, match="preprocessor_config.json"):
        load_bundle(str(tmp_path), role="encoder")


def test_roles_drop_the_half_they_do_not_run(tiny_ckpt):
    enc = load_bundle(str(tiny_ckpt), role="encoder")
    dec = load_bundle(str(tiny_ckpt), role="decode")
    assert getattr(enc.model.model, "language_model", None) is None
    assert getattr(dec.model.model, "visual", None) is None
    with pytest.raises(ValueError):
        DecodeEngine(enc)
    with pytest.raises(ValueError):
        VisionEncoder(dec)


def test_kv_slots_stay_packed_and_grow_without_changing_tokens(bundle, images):
    """Sequences finishing out of order move the last slot into the hole; growth keeps every KV."""
    enc = VisionEncoder(bundle)
    lengths = [3, 9, 5, 12, 7]
    results = [prefill_request(bundle, enc, images[:1 + i % 3], "describe the image", SamplingParams(max_tokens=n))
               for i, n in enumerate(lengths)]
    engine = DecodeEngine(bundle)
    from epdctl.runtime.kv_slots import KVSlots

    old = engine.slots  # start tiny so adding five sequences grows both dimensions
    engine.slots = KVSlots(len(old.keys), *old.shape, old.dtype, slots=1, capacity=1)
    got: dict[str, list[int]] = {}
    for i, (r, n) in enumerate(zip(results, lengths)):
        engine.add(f"s{i}", r, SamplingParams(max_tokens=n, ignore_eos=True))
        got[f"s{i}"] = []
    engine.abort("s2")
    del got["s2"]
    while engine.num_running:
        for sid, tok, _ in engine.step():
            got[sid].append(tok)
        assert engine.slots.owner == [s.seq_id for s in engine._by_slot]  # slots 0..n-1, no holes
        assert all(s.slot == i for i, s in enumerate(engine._by_slot))
    assert engine.slots.used == 0 and engine.slots.keys[0].shape[0] >= 4 and engine.slots.capacity >= 64
    for i, n in enumerate(lengths):
        if i != 2:
            alone, _ = run_alone(bundle, results[i], SamplingParams(max_tokens=n, ignore_eos=True))
            assert got[f"s{i}"] == alone and len(alone) == n
