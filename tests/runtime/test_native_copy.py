"""The hand-off's fused copy + checksum (native_copy.py): the same XXH3-64 as python xxhash for
any input cut into any pieces, the same bytes as a copy, ends with and without the library that
verify each other over real sockets and shared memory, damage after the fused copy caught at
both ends, and a clean fallback (disabled, no compiler, failed build)."""

from __future__ import annotations

import logging
import shutil
import stat

import numpy as np
import pytest
import torch
import xxhash

from epdctl.runtime.fast import native_build, native_copy
from epdctl.runtime.errors import TransferError
from epdctl.runtime.transports import parts, spans
from epdctl.runtime.wire import checksum, describe, layout

from transport_pair import assert_same, with_pair

pytestmark = pytest.mark.usefixtures("fast_hashing")  # the transports here are the fast path's

HAVE_CC = shutil.which("cc") is not None


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A library() that builds again, into an empty cache folder."""
    monkeypatch.setattr(native_copy, "_state", {})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def _dll():
    dll = native_copy.library()
    assert dll is not None, "the CI image installs gcc (scripts/test.sh); without cc xxhash hashes"
    return dll


def _cut(rng: np.random.Generator, total: int, pieces: int) -> list[np.ndarray]:
    data = rng.integers(0, 256, total, dtype=np.uint8)
    cuts = np.sort(rng.choice(np.arange(0, total + 1), pieces - 1))  # (repeats: empty pieces too)
    return [np.ascontiguousarray(p) for p in np.split(data, cuts)]


def _avx2_only():
    """The AVX2 loop, built even on an AVX-512 host (None where the host has no AVX2)."""
    if "avx2" not in native_build.cpu_id():
        return None
    return native_copy._build(native_copy.FLAGS + ("-mno-avx512f",))


@pytest.mark.parametrize("variant", ["host", "avx2"])
def test_equals_xxhash_and_copies_exactly_for_any_cut(variant):
    """Every length class of XXH3's long input (a partial last stripe, whole stripes, a block edge
    at 1,024 bytes, many blocks), pieces that end mid-stripe, empty pieces, hash-only; with the
    loop the host builds and with the AVX2 one."""
    dll, rng = _dll() if variant == "host" else _avx2_only(), np.random.default_rng(7)
    if dll is None:
        pytest.skip("no AVX2 on this host")
    lengths = [241, 255, 256, 257, 319, 320, 1023, 1024, 1025, 1088, 2047, 4096 + 63, 65_536, 1_000_003]
    lengths += [int(n) for n in rng.integers(241, 20_000, 40)]
    for total in lengths:
        for pieces in (1, 2, 7):
            src = _cut(rng, total, pieces)
            want = xxhash.xxh3_64_intdigest(b"".join(p.tobytes() for p in src))
            dst = [np.zeros(p.nbytes + 1, np.uint8) for p in src]
            got = native_copy.copy_hash(dll, [native_copy.address(p) for p in src],
                                        [native_copy.address(d) for d in dst], [p.nbytes for p in src])
            assert got == want, (total, pieces)
            assert all(np.array_equal(d[:-1], p) and d[-1] == 0 for d, p in zip(dst, src)), (total, pieces)
            hashed = native_copy.copy_hash(dll, [native_copy.address(p) for p in src], None, [p.nbytes for p in src])
            assert hashed == want


@pytest.mark.parametrize("nogil_bytes", [0, native_copy.NOGIL_HASH_BYTES])
def test_short_inputs_go_to_xxhash_and_every_entry_point_agrees(monkeypatch, nogil_bytes):
    """checksum() and span_sum() give XXH3-64 whether C (large buffers) or xxhash hashes."""
    monkeypatch.setattr(native_copy, "NOGIL_HASH_BYTES", nogil_bytes)
    dll = _dll()
    with pytest.raises(ValueError, match="241"):
        native_copy.copy_hash(dll, [0], None, [240])
    rng = np.random.default_rng(3)
    for n in (0, 1, 17, 240, 241, 70_000, 300_001):
        buf = rng.integers(0, 256, n, dtype=np.uint8)
        assert checksum(memoryview(buf)) == checksum(buf.tobytes()) == xxhash.xxh3_64_intdigest(buf.tobytes())
        assert spans.span_sum(memoryview(buf), [0], [n]) == xxhash.xxh3_64_intdigest(buf.tobytes())


@pytest.mark.parametrize("native, shift", [(True, 0), (False, 0), (True, 8), (True, 3)])
def test_write_span_same_bytes_and_checksum_either_way(monkeypatch, native, shift):
    """The C loop and the fallback write the same bytes and checksum, into a destination 64-byte
    aligned or not (``shift``)."""
    tensors = {"a": torch.randn(1001), "b": torch.arange(7, dtype=torch.int64), "c": torch.randn(33, 9).bfloat16(),
               "d": torch.empty(0), "e": torch.randn(65_000)}
    if not native:
        monkeypatch.setattr(native_copy, "_state", {"dll": None})
    header, bufs = describe({}, tensors)
    offsets, total = layout(header["tensors"])
    room = np.zeros(total + 128, np.uint8)
    start = -room.ctypes.data % 64 + shift
    dst = room[start:start + total]
    digest, lengths = spans.write_span(bufs, offsets, dst, 0, len(bufs))
    assert not room[:start].any() and not room[start + total:].any()
    assert lengths == [b.nbytes for b in bufs]
    assert digest == xxhash.xxh3_64_intdigest(b"".join(bytes(b) for b in bufs))
    for b, off in zip(bufs, offsets):
        assert dst[off:off + b.nbytes].tobytes() == bytes(b)
    assert spans.span_sum(memoryview(dst), offsets, lengths) == digest
    with pytest.raises(TransferError, match="smaller than the part"):  # nothing written past the end
        spans.write_span(bufs, offsets, np.zeros(total - 64, np.uint8), 0, len(bufs))


def _receiver_without_library(monkeypatch, receiver_native: bool) -> None:
    """One end without the library: every check a receiver makes runs in ``Incoming.add``, every
    hash a sender makes in ``TensorWriter``; the other end keeps what ``library()`` built."""
    def without(fn):
        def run(*args, **kwargs):
            saved = native_copy._state.get("dll")
            native_copy._state["dll"] = None
            try:
                return fn(*args, **kwargs)
            finally:
                native_copy._state["dll"] = saved
        return run
    if receiver_native:
        monkeypatch.setattr(parts.TensorWriter, "__call__", without(parts.TensorWriter.__call__))
        monkeypatch.setattr(parts.TensorWriter, "direct", without(parts.TensorWriter.direct))
    else:
        monkeypatch.setattr(parts.Incoming, "add", without(parts.Incoming.add))


@pytest.mark.parametrize("use_shm", [False, True])
@pytest.mark.parametrize("receiver_native", [False, True])
def test_an_end_without_the_library_verifies_the_other(monkeypatch, use_shm, receiver_native):
    """A native sender and a receiver without the library (and the reverse) over a real socket and
    shared memory: whole messages arrive; a byte changed after the sender's (fused or fallback)
    copy and hash fails both ends."""
    _dll()
    monkeypatch.setattr(native_copy, "NOGIL_HASH_BYTES", 0)  # every check of the native end in C
    _receiver_without_library(monkeypatch, receiver_native)
    g = torch.Generator().manual_seed(5)
    tensors = {f"t{i}": torch.randn(40_000 + i, generator=g) for i in range(6)} | {"big": torch.randn(300_000)}
    real_call = parts.TensorWriter.__call__

    def damaged(self, dst, first, last):
        out = real_call(self, dst, first, last)
        if last == len(self.bufs) - 1 or (last == len(self.bufs) and last - first > 1):  # a later part, hashed
            dst[self.offsets[last - 1] + 3] ^= 0x40
        return out

    async def fn(a, b):
        a.use_shm, a.shm_min_bytes, a.pipeline_min_bytes = use_shm, 0, 0
        a.part_bytes, a.direct_bytes = 100_000, 1_000_000
        await a.send(b.address, "ok", {"k": 1}, tensors)
        assert_same(tensors, (await b.recv("ok", 5))[1])
        monkeypatch.setattr(parts.TensorWriter, "__call__", damaged)
        with pytest.raises(TransferError, match="checksum"):
            await a.send(b.address, "bad", {}, tensors)
        with pytest.raises(TransferError, match="checksum"):
            await b.recv("bad", 5)
        monkeypatch.setattr(parts.TensorWriter, "__call__", real_call)
        assert a.stats["shm_sent"] == (2 if use_shm else 0)

    with_pair("zmq", fn)


def test_builds_into_a_private_cache_once(fresh):
    assert HAVE_CC, "the CI image installs gcc (scripts/test.sh)"
    dll = native_copy.library()
    assert dll is not None and native_copy.library() is dll
    folder = fresh / "epdctl"
    built = list(folder.glob("copy_xxh3-*.so"))
    assert len(built) == 1 and stat.S_IMODE(folder.stat().st_mode) == 0o700
    native_copy._state.clear()
    assert native_copy.library() is not None and list(folder.iterdir()) == built


def test_disabled_or_no_compiler_or_failed_build_falls_back(fresh, monkeypatch, caplog):
    monkeypatch.setenv("EPDCTL_NATIVE_COPY", "0")
    assert native_copy.library() is None
    for cc in ("/nonexistent/cc", "false"):
        native_copy._state.clear()
        monkeypatch.setenv("EPDCTL_NATIVE_COPY", "1")
        monkeypatch.setenv("CC", cc)
        with caplog.at_level(logging.INFO, logger=native_copy.__name__):
            assert native_copy.library() is None
        assert "using numpy and xxhash" in caplog.text
        caplog.clear()
    assert not list((fresh / "epdctl").glob("*.so"))
    buf = np.arange(5000, dtype=np.uint8)  # the fallback still gives the same checksum
    assert checksum(memoryview(buf)) == xxhash.xxh3_64_intdigest(buf.tobytes())
    folder = fresh / "epdctl"  # a cache others may write is never loaded from
    folder.chmod(0o777)
    native_copy._state.clear()
    monkeypatch.delenv("CC")
    with caplog.at_level(logging.INFO, logger=native_copy.__name__):
        assert native_copy.library() is None
    assert "is not private" in caplog.text
