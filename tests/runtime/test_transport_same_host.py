"""The same-host path's control block and doorbells over real sockets and /dev/shm: no socket
message per hand-off once a spare is lent, the socket fallbacks (no doorbell, a receiver that
stopped polling), a garbled part description, and a sender process killed half-way."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from epdctl.runtime.errors import TransferError
from epdctl.runtime.fast.transports import leases, progress, same_host
from epdctl.runtime.transports import open_transport
from epdctl.runtime.transports.zmq import ZmqTransport

from transport_pair import assert_same, with_pair

pytestmark = pytest.mark.usefixtures("fast_hashing")  # the transports here are the fast path's

ROOT = Path(__file__).resolve().parents[2]


def kv_like(n: int = 12, numel: int = 60_000) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    return {f"k{i}": torch.randn(numel, generator=g).bfloat16() for i in range(n)}


def small_parts(a) -> None:
    a.pipeline_min_bytes, a.part_bytes = 0, 200_000


def socket_kinds(b) -> list[bytes]:
    """Record the kind of every message b's socket receives."""
    kinds: list[bytes] = []
    handle = b._handle

    async def counting(frames):
        kinds.append(bytes(frames[0]))
        return await handle(frames)
    b._handle = counting
    return kinds


def test_control_block_carries_parts_and_the_answer():
    ctrl = progress.Control(np.zeros(progress.CTRL_BYTES, dtype=np.uint8))
    token = progress.token_of("ab" * 16)
    ctrl.reset(token)
    assert not ctrl.claim(token + 1) and ctrl.claim(token)
    ctrl.publish(0, {"first": 0, "sum": 7, "lengths": [4]})
    ctrl.publish(1, {"first": 1, "sums": [1, 2], "lengths": [8, -1]})
    assert ctrl.progress() == 2 and ctrl.part(1) == {"first": 1, "sums": [1, 2], "lengths": [8, -1]}
    assert ctrl.reply() is None
    ctrl.answer([b"OK", b"epd-x-1", b"f" * 32, b"17825792", b"@bell"])
    assert ctrl.reply() == [b"OK", b"epd-x-1", b"f" * 32, b"17825792", b"@bell"]
    assert not ctrl.claim(token)  # answered: not writable again under the same lease
    ctrl.reset(-1)
    assert not ctrl.claim(token)  # a dropped lease's token is spoiled
    with pytest.raises(ValueError, match="overflow"):
        ctrl.claim(-1)
        for i in range(progress.MAX_PARTS):
            ctrl.publish(i, {"first": i, "sums": list(range(40)), "lengths": [1] * 40})
    assert progress.fits(56, 8) and not progress.fits(5000, 8) and not progress.fits(10, progress.MAX_PARTS + 1)


def test_once_a_spare_is_lent_a_hand_off_puts_nothing_on_the_socket():
    tensors = kv_like()

    async def fn(a, b):
        small_parts(a)
        kinds = socket_kinds(b)
        for i in range(4):
            await a.send(b.address, f"m{i}", {"i": i}, tensors)
            meta, got = await b.recv(f"m{i}", 5)
            assert meta == {"i": i}
            assert_same(tensors, got)
        assert kinds == [b"SHM"]  # the first lease; every later message rode a spare and the doorbells
        assert a.stats["shm_sent"] == 4 and b.stats["shm_received"] == 4 and a.stats["failures"] == 0

    with_pair("zmq", fn)


def test_without_doorbells_the_socket_announces_and_answers():
    tensors = kv_like()

    async def fn(a, b):
        small_parts(a)
        a.shm.bell.close()  # the sender cannot ring (and cannot be rung)
        kinds = socket_kinds(b)
        for i in range(2):
            await a.send(b.address, f"n{i}", {}, tensors)
            assert_same(tensors, (await b.recv(f"n{i}", 5))[1])
        assert kinds.count(b"SHMGO") == 2 and a.stats["shm_sent"] == 2 and a.stats["failures"] == 0

    with_pair("zmq", fn)


def test_a_receiver_that_stopped_polling_is_finished_by_the_sender(monkeypatch):
    """Neither the poll nor the ring answers: the sender asks on the socket (SHMDONE) and the
    receiver checks every part there."""
    async def asleep(t, xid, lease):
        return None
    monkeypatch.setattr(same_host.SameHost, "_poll", asleep)
    tensors = kv_like()

    async def fn(a, b):
        small_parts(a)
        kinds = socket_kinds(b)
        await a.send(b.address, "late", {}, tensors)
        assert_same(tensors, (await b.recv("late", 5))[1])
        await a.send(b.address, "late2", {}, tensors)  # into the spare that answer lent
        assert_same(tensors, (await b.recv("late2", 5))[1])
        assert kinds.count(b"SHMDONE") == 2 and a.stats["failures"] == 0

    with_pair("zmq", fn)


def test_a_garbled_part_description_fails_both_ends(monkeypatch):
    publish = progress.Control.publish

    def garble(self, i, desc):
        publish(self, i, desc)
        if i == 1:
            off = int(self.words[progress._SLOTS + 2])
            self.block[off] = ord("}")
    monkeypatch.setattr(progress.Control, "publish", garble)
    tensors = kv_like()

    async def fn(a, b):
        small_parts(a)
        with pytest.raises(TransferError, match="malformed part"):
            await a.send(b.address, "g", {}, tensors)
        with pytest.raises(TransferError, match="malformed part"):
            await b.recv("g", 5)
        monkeypatch.undo()
        await a.send(b.address, "ok", {}, tensors)  # the endpoints keep working
        assert_same(tensors, (await b.recv("ok", 5))[1])

    with_pair("zmq", fn)


SENDER = textwrap.dedent("""
    import asyncio, os, signal, sys, torch
    from epdctl.runtime.transports import open_transport
    from epdctl.runtime.transports.zmq import ZmqTransport

    write = ZmqTransport.write_part
    calls = []

    async def dying(w, dst, first, last, n):
        calls.append(first)
        if len(calls) == 3:  # two parts written and published: die without a word
            os.kill(os.getpid(), signal.SIGKILL)
        return await write(w, dst, first, last, n)
    ZmqTransport.write_part = staticmethod(dying)

    async def main():
        t = open_transport("zmq", "127.0.0.1", timeout=5, shm=True)
        await t.start()
        t.pipeline_min_bytes, t.part_bytes = 0, 200_000
        g = torch.Generator().manual_seed(1)
        await t.send(sys.argv[1], "dying", {}, {f"k{i}": torch.randn(60_000, generator=g) for i in range(12)})
    asyncio.run(main())
""")


def test_a_sender_killed_half_way_fails_the_receivers_recv():
    async def go():
        b = open_transport("zmq", "127.0.0.1", timeout=1.0, shm=True)
        await b.start()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", SENDER, b.address, env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            _, err = await proc.communicate()
            assert proc.returncode == -9, err.decode()[-2000:]
            with pytest.raises(TransferError, match="truncated.*wrote 2 of"):
                await b.recv("dying", 10)
            a = open_transport("zmq", "127.0.0.1", timeout=5, shm=True)  # the receiver keeps serving others
            await a.start()
            try:
                await a.send(b.address, "after", {}, kv_like())
                assert_same(kv_like(), (await b.recv("after", 5))[1])
            finally:
                await a.close()
        finally:
            await b.close()
    asyncio.run(go())


@pytest.mark.parametrize("bells", [True, False])
def test_where_stores_may_be_reordered_only_rung_parts_are_read(monkeypatch, bells):
    """As on ARM: no poll of the block; parts are read as the rings (or SHMDONE) announce them."""
    monkeypatch.setattr(same_host, "ORDERED", False)
    monkeypatch.setattr(leases, "ORDERED", False)
    tensors = kv_like()

    async def fn(a, b):
        small_parts(a)
        if not bells:
            a.shm.bell.close()
        kinds = socket_kinds(b)
        for i in range(2):
            await a.send(b.address, f"w{i}", {}, tensors)
            assert_same(tensors, (await b.recv(f"w{i}", 5))[1])
        assert kinds.count(b"SHMDONE") == (0 if bells else 2) and a.stats["failures"] == 0

    with_pair("zmq", fn)


def rings(monkeypatch) -> list[bytes]:
    """Record the kind of every doorbell ring read (G, P, D, A)."""
    got: list[bytes] = []
    ring = same_host.SameHost.ring

    def counting(t, data):
        got.append(data[:1])
        return ring(t, data)
    monkeypatch.setattr(same_host.SameHost, "ring", counting)
    return got


def test_a_polling_receiver_is_not_rung_for_every_part(monkeypatch):
    """The receiver looks at the control block while the parts come (here it finds them all at
    once): the sender rings GO and the receiver ACK, no part is rung."""
    got, tensors = rings(monkeypatch), kv_like()

    async def fn(a, b):
        small_parts(a)
        for i in range(3):
            await a.send(b.address, f"p{i}", {}, tensors)
            assert_same(tensors, (await b.recv(f"p{i}", 5))[1])
        assert got.count(b"P") == 0 and got.count(b"G") == 3 and a.stats["failures"] == 0

    with_pair("zmq", fn)


def test_a_receiver_asleep_between_parts_is_rung_awake(monkeypatch):
    """A sender slower than the receiver's poll (a part every ms, longer than its poll, shorter than its idle limit): the receiver sleeps, says so
    in the control block, and each part's ring wakes it; nothing goes on the socket."""
    got, tensors = rings(monkeypatch), kv_like()
    write = ZmqTransport.write_part

    async def slow(w, dst, first, last, n):
        await asyncio.sleep(0.001)
        return await write(w, dst, first, last, n)
    monkeypatch.setattr(ZmqTransport, "write_part", staticmethod(slow))

    async def fn(a, b):
        small_parts(a)
        kinds = socket_kinds(b)
        for i in range(3):
            await a.send(b.address, f"s{i}", {}, tensors)
            assert_same(tensors, (await b.recv(f"s{i}", 5))[1])
        assert got.count(b"P") >= 3 and kinds == [b"SHM"] and a.stats["failures"] == 0

    with_pair("zmq", fn)
