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
from epdctl.runtime.wire import (embeds_to_tensors, kv_to_tensors, pack, parse_header, tensors_to_embeds,
                                 tensors_to_prefill_result, unpack)
from epdctl.runtime.encoder_engine import EncodedImage
from epdctl.runtime.prefill_engine import PrefillResult

KINDS = ["zmq", "zmq-ipc", "mooncake"]
PORTS = {"zmq": (33200, 33201), "zmq-ipc": (0, 0), "mooncake": (33210, 33211)}
UNREACHABLE = {"zmq": "zmq+tcp://127.0.0.1:33299", "zmq-ipc": "zmq+ipc:///tmp/epd-nobody-listens.sock",
               "mooncake": "mooncake://127.0.0.1:33298"}


def sample_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"f32": torch.randn(33, 17, generator=g), "bf16": torch.randn(5, 8, generator=g).bfloat16(),
            "f16": torch.randn(9, generator=g).half(), "i64": torch.arange(-5, 6), "u8": torch.arange(200).byte(),
            "empty": torch.empty(0, 4), "scalar": torch.tensor(3.5),
            "noncontig": torch.randn(6, 4, generator=g).t()}


def assert_same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]), k


def with_pair(kind: str, fn, timeout: float = 5.0):
    async def go():
        pa, pb = PORTS[kind]
        a = open_transport(kind, "127.0.0.1", port=pa, timeout=timeout)
        b = open_transport(kind, "127.0.0.1", port=pb, timeout=timeout)
        await a.start()
        await b.start()
        try:
            return await fn(a, b)
        finally:
            await a.close()
            await b.close()
    return asyncio.run(go())


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
        assert b._pool.stats == {"segments_created": 2, "segments_reused": 2} and a.stats["shm_sent"] == 3

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
    from epdctl.runtime.transports.shm import SenderMaps

    big = {"x": torch.randn(2**18)}

    async def fn(a, b):
        a._maps = SenderMaps(directory=str(tmp_path))  # this sender's /dev/shm is not the receiver's
        for key in ("h1", "h2"):
            await a.send(b.address, key, {}, big)
            assert torch.equal((await b.recv(key, 5))[1]["x"], big["x"])
        assert a.stats["shm_sent"] == 0 and a._same_host == {b.address: False}
        assert not b._leases.open  # the one lease asked for was returned

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
    from epdctl.runtime.transports.shm import BufferPool

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

    from epdctl.runtime.transports import shm

    code = ("import os, sys; from epdctl.runtime.transports.shm import SegmentPool; p = SegmentPool(); "
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


def kv_like(n: int, numel: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    return {f"t{i}": torch.randn(numel, generator=g).bfloat16() if i % 2 else torch.randn(numel, generator=g)
            for i in range(n)}


@pytest.mark.parametrize("use_shm, pipelined", [(False, True), (False, False), (True, True)])
def test_message_in_many_parts_arrives_whole(use_shm, pipelined):
    """Parts of 64 KiB (shared memory; on the socket each its own message, or all in one message
    as a large one goes) and tensors sent from their own memory (socket): many parts, odd sizes,
    every dtype; the receiver gets exactly the tensors."""
    tensors = {**kv_like(9, 20_011), **sample_tensors(), "big": torch.randn(300_000)}

    async def fn(a, b):
        a.use_shm = use_shm
        a.pipeline_min_bytes = 0
        a.part_bytes, a.direct_bytes = 64 * 1024, 100_000
        if not pipelined:
            a.pipeline_bytes, a.large_part_bytes = 0, 64 * 1024  # as a large message goes: one BLOB, many frames
        for key in ("m1", "m2"):
            await a.send(b.address, key, {"k": key}, tensors)
            meta, got = await b.recv(key, 5)
            assert meta == {"k": key}
            assert_same(tensors, got)
        assert a.stats["shm_sent"] == (2 if use_shm else 0)

    with_pair("zmq", fn)


@pytest.mark.parametrize("use_shm", [False, True])
@pytest.mark.parametrize("damage", ["corrupt-late-part", "missing-late-buffer", "over-long-direct"])
def test_damage_in_a_later_part_raises_on_both_ends(use_shm, damage):
    tensors = kv_like(6, 30_000)
    frames = pack({}, tensors)
    bad = list(frames)
    if damage == "corrupt-late-part":
        body = bytearray(bad[5])
        body[100] ^= 1
        bad[5] = bytes(body)
    elif damage == "missing-late-buffer":
        bad = bad[:-1]
    else:
        bad[4] = bytes(bad[4]) + b"\0"

    async def fn(a, b):
        a.use_shm, a.shm_min_bytes = use_shm, 0
        a.pipeline_min_bytes = 0
        a.part_bytes, a.direct_bytes = 100_000, 100_000
        with pytest.raises(TransferError):
            await a.send_frames(b.address, "bad", bad)
        with pytest.raises(TransferError, match="checksum|truncated"):
            await b.recv("bad", 5)
        await a.send(b.address, "good", {}, tensors)  # the endpoints keep working
        assert_same(tensors, (await b.recv("good", 5))[1])

    with_pair("zmq", fn)


def test_spare_segment_gone_falls_back_to_a_fresh_lease():
    big = {"x": torch.randn(2**18)}

    async def fn(a, b):
        await a.send(b.address, "p1", {}, big)
        await b.recv("p1", 5)
        assert b.address in a._spares
        for xid in list(b._leases.open):  # the receiver dropped its spare (as on expiry)
            b._leases.drop(xid)
        await a.send(b.address, "p2", {}, big)
        assert torch.equal((await b.recv("p2", 5))[1]["x"], big["x"])
        assert a.stats["failures"] == 0 and a.stats["shm_sent"] == 2

    with_pair("zmq", fn)


def test_spare_lease_forgotten_by_the_receiver_is_answered_and_the_send_retried():
    big = {"x": torch.randn(2**18)}

    async def fn(a, b):
        await a.send(b.address, "q1", {}, big)
        await b.recv("q1", 5)
        b._leases.open.clear()  # the segment still exists, the receiver no longer knows the lease
        await a.send(b.address, "q2", {}, big)  # SHMEND is refused, then a fresh lease carries it
        assert torch.equal((await b.recv("q2", 5))[1]["x"], big["x"])
        assert a.stats["failures"] == 0 and b.stats["failures"] == 0 and a.stats["shm_sent"] == 2

    with_pair("zmq", fn)


def test_split_cuts_at_tensor_boundaries_and_isolates_large_tensors():
    from epdctl.runtime.transports.parts import split
    from epdctl.runtime.wire import layout

    table = [{"nbytes": n} for n in (10, 10, 500, 10, 10, 10, 300, 5)]
    offsets, total = layout(table)
    assert split(table, offsets, total, part_bytes=1 << 20) == [(0, 8)]
    assert split(table, offsets, total, part_bytes=1 << 20, direct_bytes=300) == [(0, 2), (2, 3), (3, 6), (6, 7), (7, 8)]
    # offsets 0, 64, 128, 640, 704, 768, 832, 1152 (64-byte slots): a part closes once it spans 100
    assert split(table, offsets, total, part_bytes=100) == [(0, 2), (2, 3), (3, 5), (5, 7), (7, 8)]


@pytest.mark.parametrize("use_shm, where", [(False, "copied-run"), (True, "copied-run"), (False, "own-memory")])
def test_damage_after_the_senders_checksum_raises_on_both_ends(monkeypatch, use_shm, where):
    """A byte changed between the sender's hash and the receiver (in a later part of a run of
    copied tensors, or in a tensor sent from its own memory) fails both ends with 'checksum'."""
    from epdctl.runtime.transports import parts

    tensors = {**kv_like(6, 30_000), "big": torch.randn(200_000)}
    calls = []

    def damaged_write(self, dst, first, last):
        digest, lengths = parts.write_span(self.bufs, self.offsets, dst, first, last)
        calls.append(first)
        if len(calls) == 2:  # the second part, after it was hashed
            dst[self.offsets[first] + 5] ^= 0x10
        return digest, lengths

    def damaged_direct(self, i):
        frame, digest, n = original_direct(self, i)
        body = bytearray(frame)
        body[-1] ^= 1
        return memoryview(body), digest, n

    original_direct = parts.TensorWriter.direct
    if where == "copied-run":
        monkeypatch.setattr(parts.TensorWriter, "__call__", damaged_write)
    else:
        monkeypatch.setattr(parts.TensorWriter, "direct", damaged_direct)

    async def fn(a, b):
        a.use_shm, a.shm_min_bytes = use_shm, 0
        a.pipeline_min_bytes = 0
        a.part_bytes, a.direct_bytes = 100_000, 500_000
        with pytest.raises(TransferError, match="checksum"):
            await a.send(b.address, "bad", {}, tensors)
        with pytest.raises(TransferError, match="checksum"):
            await b.recv("bad", 5)
        monkeypatch.undo()
        await a.send(b.address, "good", {}, tensors)  # the endpoints keep working
        assert_same(tensors, (await b.recv("good", 5))[1])

    with_pair("zmq", fn)  # (shared memory copies every tensor: no part there is sent from its own memory)


def test_parts_without_their_first_part_raise_on_both_ends():
    """The last part of a socket message whose first part never came is refused, and the receiver's
    recv() says the transfer was truncated; a half-sent message is dropped after the timeout."""
    import zmq

    from epdctl.runtime.transports.streams import Streams

    def orphan_parts(endpoint: str) -> list[bytes]:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.connect(endpoint)
        try:
            desc = b'[{"first": 1, "sum": 0, "lengths": [4]}]'
            sock.send_multipart([b"BLOBPART", b"orphan", b"", desc, b"abcd"])
            sock.send_multipart([b"BLOB", b"orphan", b"", desc, b"abcd"])
            assert sock.poll(5000)
            return sock.recv_multipart()
        finally:
            sock.close(linger=0)
            ctx.term()

    async def fn(a, b):
        reply = await asyncio.to_thread(orphan_parts, b.address[4:])  # the loop keeps serving b
        assert reply[0] == b"ERR" and b"without its first part" in reply[1]
        with pytest.raises(TransferError, match="truncated"):
            await b.recv("orphan", 5)

    with_pair("zmq", fn)
    streams = Streams(timeout=0.0)
    frames = pack({}, {"x": torch.arange(4)})
    streams.keep(streams.take("half", frames[0]))
    assert "half" in streams.open
    streams.purge()
    assert not streams.open
