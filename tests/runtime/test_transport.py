"""Wire format and transports over real sockets (ZMQ tcp/ipc, Mooncake TCP) in one process.

Cross-process hand-offs (and damaged payloads sent to another process) are covered in
test_split_pipeline.py; here: round trips of every dtype, damage detection, timeouts, discard.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from epdctl.runtime.errors import TransferError
from epdctl.runtime.sampling import SamplingParams
from epdctl.runtime.transports import open_transport
from epdctl.runtime.wire import (embeds_to_tensors, kv_to_tensors, pack, tensors_to_embeds,
                                 tensors_to_prefill_result, unpack)
from epdctl.runtime.encoder_engine import EncodedImage
from epdctl.runtime.prefill_engine import PrefillResult

from transport_pair import KINDS, UNREACHABLE, assert_same, sample_tensors, with_pair

pytestmark = pytest.mark.usefixtures("fast_hashing")  # the transports here are the fast path's


def test_wire_roundtrip_and_damage_detection():
    tensors = sample_tensors()
    frames = pack({"x": [1, "y"]}, tensors)
    meta, out = unpack(frames)
    assert meta == {"x": [1, "y"]}
    assert_same(tensors, out)
    flipped = bytearray(frames[1])
    flipped[7] ^= 1
    with pytest.raises(TransferError, match="checksum"):
        unpack([frames[0], bytes(flipped), *frames[2:]])
    with pytest.raises(TransferError, match="truncated"):
        unpack([frames[0], bytes(frames[1])[:-4], *frames[2:]])
    with pytest.raises(TransferError, match="truncated"):
        unpack(frames[:-1])
    with pytest.raises(TransferError, match="JSON"):
        unpack([frames[0][:10], *frames[1:]])


def test_kv_and_embedding_messages_roundtrip():
    kv = [(torch.randn(1, 2, 11, 16), torch.randn(1, 2, 11, 16)) for _ in range(3)]
    result = PrefillResult(first_token=42, first_logits=torch.randn(100), kv=kv, rope_delta=-7, prompt_len=11)
    back = tensors_to_prefill_result(*unpack(pack(*kv_to_tensors(result))))
    assert (back.first_token, back.rope_delta, back.prompt_len) == (42, -7, 11)
    assert all(torch.equal(a, b) for pair, pair2 in zip(kv, back.kv) for a, b in zip(pair, pair2))
    imgs = [EncodedImage("d1", torch.randn(4, 8), (1, 4, 4), False), EncodedImage("d2", torch.randn(16, 8), (1, 8, 8), True)]
    back_imgs = tensors_to_embeds(*unpack(pack(*embeds_to_tensors(imgs))))
    assert [(e.digest, e.grid_thw, e.cached) for e in back_imgs] == [("d1", (1, 4, 4), False), ("d2", (1, 8, 8), True)]
    assert all(torch.equal(a.embeds, b.embeds) for a, b in zip(imgs, back_imgs))
    assert SamplingParams.from_dict(SamplingParams(seed=3, stop_token_ids=[1]).to_dict()).seed == 3


@pytest.mark.parametrize("kind", KINDS)
def test_roundtrip_every_dtype_and_large_payload(kind):
    tensors = sample_tensors()
    big = {"kv": torch.randn(3 * 2**20)}  # 12 MiB

    async def fn(a, b):
        n = await a.send(b.address, "k1", {"m": 1}, tensors)
        meta, got = await b.recv("k1", 5)
        assert meta == {"m": 1} and n >= sum(t.numel() * t.element_size() for t in tensors.values())
        assert_same(tensors, got)
        recv = asyncio.create_task(b.recv("k2", 20))  # waiting before the data arrives works too
        await a.send(b.address, "k2", {}, big)
        assert torch.equal((await recv)[1]["kv"], big["kv"])
        assert a.stats["transfers_sent"] == 2 and b.stats["transfers_received"] == 2
        assert b.stats["bytes_received"] >= 12 * 2**20 and a.stats["failures"] == 0

    with_pair(kind, fn)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("damage", ["corrupt", "truncated", "missing-buffer"])
def test_damaged_payload_raises_on_both_ends(kind, damage):
    frames = pack({}, {"a": torch.randn(1000), "b": torch.arange(10)})
    body = bytearray(frames[1])
    if damage == "corrupt":
        body[2000] ^= 0x80
        damaged = [frames[0], bytes(body), frames[2]]
    elif damage == "truncated":
        damaged = [frames[0], bytes(body[:-1]), frames[2]]
    else:
        damaged = [frames[0], frames[1]]

    async def fn(a, b):
        with pytest.raises(TransferError):
            await a.send_frames(b.address, "bad", damaged)
        with pytest.raises(TransferError, match="checksum|truncated"):
            await b.recv("bad", 5)
        assert a.stats["failures"] == 1 and b.stats["failures"] == 1
        await a.send(b.address, "good", {}, {"x": torch.ones(3)})  # the endpoint keeps working
        assert torch.equal((await b.recv("good", 5))[1]["x"], torch.ones(3))

    with_pair(kind, fn)


@pytest.mark.parametrize("kind", KINDS)
def test_send_to_unreachable_peer_fails_cleanly(kind):
    async def fn(a, b):
        with pytest.raises(TransferError, match="no answer|could not hand"):
            await a.send(UNREACHABLE[kind], "k", {}, {"x": torch.ones(4)})
        assert a.stats["failures"] == 1

    with_pair(kind, fn, timeout=1.0)


@pytest.mark.parametrize("kind", ["zmq", "mooncake"])
def test_wrong_address_scheme_is_rejected(kind):
    other = {"zmq": "mooncake://127.0.0.1:1", "mooncake": "zmq+tcp://127.0.0.1:1"}[kind]

    async def fn(a, b):
        with pytest.raises(TransferError, match="not a"):
            await a.send(other, "k", {}, {"x": torch.ones(1)})

    with_pair(kind, fn)


@pytest.mark.parametrize("kind", ["zmq", "mooncake"])
def test_recv_timeout_and_discard(kind):
    async def fn(a, b):
        with pytest.raises(asyncio.TimeoutError):
            await b.recv("never", 0.2)
        await a.send(b.address, "dropme", {}, {"x": torch.ones(2)})
        b.discard("dropme")  # the data that arrived for it is freed
        with pytest.raises(asyncio.TimeoutError):
            await b.recv("dropme", 0.2)

    with_pair(kind, fn)


def test_unknown_transport_kind():
    with pytest.raises(ValueError, match="choose"):
        open_transport("carrier-pigeon", "127.0.0.1")  # type: ignore[arg-type]


def test_sends_reuse_one_connection_per_peer():
    async def fn(a, b):
        for i in range(5):
            await a.send(b.address, f"k{i}", {}, {"x": torch.full((4,), float(i))})
            assert torch.equal((await b.recv(f"k{i}", 5))[1]["x"], torch.full((4,), float(i)))
        assert a.stats["connects"] == 1

    with_pair("zmq", fn)


def test_same_host_large_payload_goes_through_shared_memory_and_segments_are_reused():
    big = {"k0": torch.randn(2**20), "v0": torch.randn(3, 1000).bfloat16(), "tail": torch.arange(7)}

    async def fn(a, b):
        await a.send(b.address, "s1", {"m": 1}, big)
        meta, got = await b.recv("s1", 5)
        assert meta == {"m": 1} and a.stats["shm_sent"] == 1 and b.stats["shm_received"] == 1
        assert_same(big, got)
        got["k0"].add_(1)  # received tensors are writable views, the sender's are untouched
        assert not torch.equal(got["k0"], big["k0"])
        del got
        await a.send(b.address, "s2", {}, big)  # into the spare segment lent with the first answer
        assert_same(big, (await b.recv("s2", 5))[1])
        await a.send(b.address, "s3", {}, big)
        assert_same(big, (await b.recv("s3", 5))[1])
        # one segment for s1, the spare (s2) lent while s1's tensors lived; then s1's comes back
        assert b.shm.pool.stats == {"segments_created": 2, "segments_reused": 2} and a.stats["shm_sent"] == 3

    with_pair("zmq", fn)


@pytest.mark.parametrize("damage", ["corrupt", "truncated", "missing-buffer", "over-long"])
def test_damaged_payload_through_shared_memory_raises_on_both_ends(damage):
    frames = pack({}, {"a": torch.randn(1000), "b": torch.arange(10)})
    body = bytearray(frames[1])
    damaged = {"corrupt": lambda: [frames[0], bytes(body[:2000]) + bytes([body[2000] ^ 0x80]) + bytes(body[2001:]),
                                   frames[2]],
               "truncated": lambda: [frames[0], bytes(body[:-1]), frames[2]],
               "missing-buffer": lambda: [frames[0], frames[1]],
               "over-long": lambda: [frames[0], bytes(body) + b"xx", frames[2]]}[damage]()

    async def fn(a, b):
        a.shm_min_bytes = 0
        with pytest.raises(TransferError):
            await a.send_frames(b.address, "bad", damaged)
        assert a.stats["shm_sent"] == 1
        with pytest.raises(TransferError, match="checksum|truncated"):
            await b.recv("bad", 5)
        await a.send(b.address, "good", {}, {"x": torch.ones(3)})
        assert torch.equal((await b.recv("good", 5))[1]["x"], torch.ones(3))

    with_pair("zmq", fn)


def test_peer_on_another_host_falls_back_to_the_socket(tmp_path):
    from epdctl.runtime.fast.transports.shm import SenderMaps

    big = {"x": torch.randn(2**18)}

    async def fn(a, b):
        a.shm.maps = SenderMaps(directory=str(tmp_path))  # this sender's /dev/shm is not the receiver's
        for key in ("h1", "h2"):
            await a.send(b.address, key, {}, big)
            assert torch.equal((await b.recv(key, 5))[1]["x"], big["x"])
        assert a.stats["shm_sent"] == 0 and a.shm.on_host == {b.address: False}
        assert not b.shm.leases.open  # the one lease asked for was returned

    with_pair("zmq", fn)


def test_write_span_equals_pack_then_fill_and_hashes_the_tensors_bytes_in_order():
    import numpy as np
    import xxhash

    from epdctl.runtime.transports.spans import span_sum, write_span
    from epdctl.runtime.wire import describe, fill, layout, unpack_written

    tensors = {"big": torch.randn(300_001), "odd": torch.arange(13, dtype=torch.int16), "e": torch.empty(0),
               "bf": torch.randn(7, 3).bfloat16()}
    frames = pack({"m": 2}, tensors)
    header, bufs = describe({"m": 2}, tensors)
    offsets, total = layout(header["tensors"])
    a, b = np.zeros(total, np.uint8), np.full(total, 7, np.uint8)  # b's padding differs: not hashed
    lengths = fill(frames[0], frames[1:], a)
    first_sum, written = write_span(bufs, offsets, b, 0, 1)  # in two parts: the big one (chunked) first
    more_sum, more_written = write_span(bufs, offsets, b, 1, 4)
    assert written + more_written == lengths
    for off, n in zip(offsets, lengths):
        assert np.array_equal(a[off:off + n], b[off:off + n])
    assert first_sum == xxhash.xxh3_64_intdigest(bytes(frames[1]))
    assert more_sum == xxhash.xxh3_64_intdigest(b"".join(bytes(f) for f in frames[2:]))
    assert more_sum == span_sum(memoryview(b), offsets[1:], lengths[1:])
    meta, got = unpack_written(frames[0], torch.from_numpy(b), lengths)
    assert meta == {"m": 2}
    assert_same(tensors, got)


def test_send_buffers_are_reused_by_size():
    from epdctl.runtime.fast.transports.shm import BufferPool

    pool = BufferPool(max_idle_bytes=8 << 20)
    a, b = pool.take(3 << 20), pool.take(100)
    pool.give(a)
    pool.give(b)
    assert pool.take(100) is b and pool.take(3 << 20) is a  # each size gets its own buffer back
    assert pool.take(5 << 20) is not a
    pool.give(pool.take(9 << 20))  # over the idle bound: not kept
    assert not pool._idle


def test_segments_of_a_killed_receiver_are_swept_by_the_next_one():
    import os
    import subprocess
    import sys

    from epdctl.runtime.fast.transports import shm

    code = ("import os, sys; from epdctl.runtime.fast.transports.shm import SegmentPool; p = SegmentPool(); "
            "s = p.lease(10); print(s.name, flush=True); os._exit(0)")  # dies without closing the pool
    name = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert os.path.exists(os.path.join(shm.SHM_DIR, name))
    mine = shm.SegmentPool()  # a new receiver on this host cleans up after the dead one
    try:
        assert not os.path.exists(os.path.join(shm.SHM_DIR, name))
        seg = mine.lease(10)
        assert shm.sweep_dead() == 0 and os.path.exists(os.path.join(shm.SHM_DIR, seg.name))  # alive: kept
    finally:
        mine.close()


def test_segments_of_8_to_24_mib_rotate_among_four():
    """Each spare is then a segment the receiver last read three hand-offs ago (out of its
    caches); smaller and larger ones keep to the two that suffice. /dev/shm full: reuse."""
    from epdctl.runtime.fast.transports import shm

    pool = shm.SegmentPool()
    try:
        def cycle(nbytes: int, n: int) -> list[str]:
            names = []
            for _ in range(n):  # one in use while the next is lent, as the same-host path does
                seg = pool.lease(nbytes)
                names.append(seg.name)
                pool.give_back(seg)
            return names
        held = pool.lease(16 << 20)
        names = cycle(16 << 20, 8)
        assert len(set(names) | {held.name}) == shm.ROTATE and names[3:6] == names[:3]  # oldest idle first
        pool.give_back(held)
        assert len(set(cycle(2 << 20, 6))) == 1 and len(set(cycle(40 << 20, 6))) == 1
    finally:
        pool.close()
    pool = shm.SegmentPool()
    try:
        first = pool.lease(16 << 20)
        pool.give_back(first)

        def full(nbytes: int) -> shm.Segment:
            raise OSError(28, "No space left on device")
        pool._create = full  # type: ignore[method-assign]
        assert pool.lease(16 << 20) is first and pool.stats == {"segments_created": 1, "segments_reused": 1}
    finally:
        pool.close()
