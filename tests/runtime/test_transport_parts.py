"""A message in parts over real sockets and shared memory: pipelined parts, spare leases, damage
in a later part or after the sender's checksum, parts without their first part (one process)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from epdctl.runtime.errors import TransferError
from epdctl.runtime.wire import pack

from transport_pair import assert_same, sample_tensors, with_pair

pytestmark = pytest.mark.usefixtures("fast_hashing")  # the transports here are the fast path's


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
        assert b.address in a.shm.spares
        for xid in list(b.shm.leases.open):  # the receiver dropped its spare (as on expiry)
            b.shm.leases.drop(xid)
        await a.send(b.address, "p2", {}, big)
        assert torch.equal((await b.recv("p2", 5))[1]["x"], big["x"])
        assert a.stats["failures"] == 0 and a.stats["shm_sent"] == 2

    with_pair("zmq", fn)


def test_spare_lease_forgotten_by_the_receiver_is_answered_and_the_send_retried():
    big = {"x": torch.randn(2**18)}

    async def fn(a, b):
        await a.send(b.address, "q1", {}, big)
        await b.recv("q1", 5)
        b.shm.leases.open.clear()  # the segment still exists, the receiver no longer knows the lease
        await a.send(b.address, "q2", {}, big)  # SHMDONE is refused, then a fresh lease carries it
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
