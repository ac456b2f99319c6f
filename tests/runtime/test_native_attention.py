"""The decode step's C attention (native_attention.py): equal to SDPA on the decode's shapes, the
same tokens as torch's path and as one-process generate(), and a clean fallback without it."""

from __future__ import annotations

import logging
import os
import shutil
import stat

import pytest
import torch
from tiny_model import decode_all, image_messages, reference_generate
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from epdctl.runtime.fast import native_attention, native_build
from epdctl.runtime.fast.decode import FastDecodeEngine as DecodeEngine, NativeSlotCache
from epdctl.runtime.encoder_engine import VisionEncoder
from epdctl.runtime.kv_slots import KVSlots, SlotCache
from epdctl.runtime.fast.native_attention import RowLengths, attend, kernel
from epdctl.runtime.prefill_engine import LanguagePrefill
from epdctl.runtime.prompt import build_prompt
from epdctl.runtime.sampling import SamplingParams
from epdctl.runtime.fast.slot_attention import slot_attention

HAVE_CC = shutil.which("cc") is not None


class _Attn(torch.nn.Module):
    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A kernel() that builds again, into an empty cache folder."""
    monkeypatch.setattr(native_attention, "_state", {})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def test_a_new_build_prunes_all_but_the_newest_builds_of_its_library(fresh):
    folder = fresh / "epdctl"
    folder.mkdir(mode=0o700)
    old = [folder / f"slot_attention-old{i}.so" for i in range(6)]
    for i, path in enumerate(old):
        path.write_bytes(b"stale")
        os.utime(path, (1_000_000 + i, 1_000_000 + i))  # old5 is the newest of them
    other = folder / "copy_xxh3-old.so"
    other.write_bytes(b"another library")
    os.utime(other, (1, 1))
    assert kernel() is not None
    left = sorted(p.name for p in folder.glob("slot_attention-*.so"))
    new = [n for n in left if not n.startswith("slot_attention-old")]
    assert len(new) == 1 and len(left) == native_build.KEEP
    assert [n for n in left if n.startswith("slot_attention-old")] == [
        f"slot_attention-old{i}.so" for i in (3, 4, 5)]
    assert other.exists()  # another library's builds are its own to prune


def test_builds_into_a_private_cache_once(fresh):
    assert HAVE_CC, "the CI image installs gcc (scripts/test.sh); without cc the torch path runs"
    dll = kernel()
    assert dll is not None and kernel() is dll
    folder = fresh / "epdctl"
    built = list(folder.glob("slot_attention-*.so"))
    assert len(built) == 1 and stat.S_IMODE(folder.stat().st_mode) == 0o700
    native_attention._state.clear()
    assert kernel() is not None and list(folder.iterdir()) == built  # the second load reuses the file


def test_another_cpu_builds_its_own(fresh, monkeypatch):
    """A home folder shared by nodes of different CPUs never hands one node another's -march=native code."""
    assert "flags" in native_attention.cpu_id() or "features" in native_attention.cpu_id().lower()
    assert kernel() is not None
    native_attention._state.clear()
    monkeypatch.setattr(native_attention, "cpu_id", lambda: "model name: another CPU")
    assert kernel() is not None
    assert len(list((fresh / "epdctl").glob("slot_attention-*.so"))) == 2


def test_a_cache_others_may_write_is_never_loaded_from(fresh, caplog):
    """A library loaded from the cache runs in the worker: a group/world-writable folder is refused."""
    folder = fresh / "epdctl"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    with caplog.at_level(logging.INFO, logger=native_attention.__name__):
        assert kernel() is None
    assert "is not private" in caplog.text and "chmod 700" in caplog.text
    assert not list(folder.iterdir())
    native_attention._state.clear()
    folder.chmod(0o700)
    assert kernel() is not None


def test_loading_it_keeps_denormals(fresh):
    """Linked without crtfastmath: the process (torch) still computes subnormal numbers."""
    assert kernel() is not None
    assert float(torch.tensor([1e-38]) / 1000) > 0.0


@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 2, 32), (4, 2, 64), (4, 4, 16), (8, 1, 128), (2, 1, 300)])
def test_equals_sdpa_and_reads_each_row_to_its_length(heads, kv_heads, dim):
    dll = kernel()
    assert dll is not None
    g = torch.Generator().manual_seed(heads * 100 + dim)
    lengths = torch.tensor([3, 17, 140, 9, 0, 63])
    n, width = len(lengths), int(lengths.max()) + 1
    table_k = torch.randn(8, kv_heads, 192, dim, generator=g)  # a slot table: the batch is a strided view of it
    table_v = torch.randn(8, kv_heads, 192, dim, generator=g)
    q = torch.randn(n, 1, heads, dim, generator=g).transpose(1, 2)  # transformers' layout after q_proj
    seen = (torch.arange(width).view(1, -1) <= lengths.view(-1, 1)).view(n, 1, 1, width)
    module = _Attn(heads // kv_heads)
    want, _ = sdpa_attention_forward(module, q, table_k[:n, :, :width], table_v[:n, :, :width], seen, scaling=0.2)
    got, _ = slot_attention(module, q, table_k[:n, :, :width], table_v[:n, :, :width],
                            RowLengths(lengths + 1, dll), scaling=0.2)
    assert got.shape == want.shape == (n, 1, heads, dim)
    assert torch.allclose(got, want, atol=2e-6)
    for table in (table_k, table_v):
        for i, length in enumerate(lengths.tolist()):
            table[i, :, length + 1:] = float("nan")  # never read
    again = attend(dll, q, table_k[:n, :, :width], table_v[:n, :, :width], lengths + 1, 0.2)
    assert torch.equal(again, got)


def test_refuses_views_it_cannot_walk():
    dll = kernel()
    assert dll is not None
    k = torch.randn(2, 2, 64, 8).transpose(2, 3)  # columns not contiguous
    with pytest.raises(ValueError, match="contiguous columns"):
        attend(dll, torch.randn(2, 4, 1, 8), k, k, torch.tensor([3, 4]), 1.0)


def test_slot_write_equals_torch_write():
    dll = kernel()
    assert dll is not None
    g = torch.Generator().manual_seed(7)
    tables = []
    for native in (None, dll):
        slots = KVSlots(layers=2, kv_heads=2, head_dim=16, dtype=torch.float32, slots=4, capacity=64)
        for i, length in enumerate((5, 30, 1)):
            slots.add(f"s{i}", [(torch.ones(1, 2, length, 16) * (i + 1),) * 2] * 2, room=8)
        cache = SlotCache(slots, 3) if native is None else NativeSlotCache(slots, 3, native)
        new_k = torch.randn(3, 1, 2, 16, generator=torch.Generator().manual_seed(1)).transpose(1, 2)
        new_v = torch.randn(3, 2, 1, 16, generator=g) if native is None else tables[0][2]
        for layer in range(2):
            k, v = cache.update(new_k, new_v, layer)
            assert k.shape == v.shape == (3, 2, 31, 16)
        tables.append((slots.keys, slots.values, new_v))
    for (want_k, want_v, _), (got_k, got_v, _) in zip(tables[:1], tables[1:]):
        assert all(torch.equal(a, b) for a, b in zip(want_k + want_v, got_k + got_v))
    with pytest.raises(ValueError, match="contiguous fp32"):
        native_attention.write(dll, new_k, new_v, slots.keys[0].transpose(2, 3), slots.values[0], cache.cols)


def test_disabled_or_no_compiler_or_failed_build_falls_back(fresh, monkeypatch, caplog):
    monkeypatch.setenv("EPDCTL_NATIVE_ATTENTION", "0")
    assert kernel() is None
    for cc in ("/nonexistent/cc", "false"):
        native_attention._state.clear()
        monkeypatch.setenv("EPDCTL_NATIVE_ATTENTION", "1")
        monkeypatch.setenv("CC", cc)
        with caplog.at_level(logging.INFO, logger=native_attention.__name__):
            assert kernel() is None
        assert "using torch's" in caplog.text
        caplog.clear()
    assert not list((fresh / "epdctl").glob("*.so"))


def _decode(bundle, results, params, native: bool) -> tuple[dict[str, list[int]], dict[str, list[torch.Tensor]]]:
    engine = DecodeEngine(bundle, keep_logits=True)
    if not native:
        engine.native = None
    assert (engine.native is not None) == native
    tokens = decode_all(engine, results, params)
    return tokens, {sid: engine.pop_logits(sid) for sid in tokens}


def test_decode_tokens_equal_torch_path_and_generate(bundle, images):
    enc, pre = VisionEncoder(bundle), LanguagePrefill(bundle)
    params = SamplingParams(max_tokens=12)
    cases = [(images[:1], "describe the image"), (images[1:5], "count the images"), (images[:8], "what colour"),
             ([], "describe the image")]
    results = []
    for imgs, text in cases:
        encoded = enc.encode(imgs)
        prompt = build_prompt(bundle, image_messages(len(imgs), text), [e.grid_thw for e in encoded])
        results.append(pre.prefill(prompt, encoded, params))
    native, native_logits = _decode(bundle, results, params, native=True)
    plain, plain_logits = _decode(bundle, results, params, native=False)
    assert native == plain
    for sid in native:
        assert max(float((a - b).abs().max()) for a, b in zip(native_logits[sid], plain_logits[sid])) < 1e-4
    for i, (imgs, text) in enumerate(cases[:2]):
        _, ref, _ = reference_generate(bundle, imgs, image_messages(len(imgs), text), params.max_tokens)
        assert native[f"s{i}"] == ref
