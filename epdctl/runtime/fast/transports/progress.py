"""The control block at the end of a lent shared-memory segment: the same-host path's part
descriptions, progress and answer, shared instead of sent.

A hand-off through shared memory used to send one ZMQ message per part (SHMPART) and wait for a
ZMQ answer: each message woke three threads in two processes (the sender's I/O thread, the
receiver's I/O thread and its event loop), and at 16 MiB those wake-ups cost more than the copy.
Now the sender publishes each part's description (its checksum and lengths) here and bumps
``progress``; the receiver checks part i while part i+1 is written, then writes its answer here
and sets ``ack``. Who wakes whom is ``doorbell.py``'s and ``same_host.py``'s business; the polls
that read this block are short and bounded (``POLL_SPIN_S``, ``ACK_SPIN_S``) and yield the CPU
between looks. On CPUs that may reorder stores (not x86: ``ORDERED``) neither side polls: a part
is read only once the sender's ring (or SHMDONE) announced it, the answer once the ACK ring came.
Every byte is still checked against the sender's checksum (a torn or stale read is a checksum or
length error, never a wrong tensor), and the ``token`` (from the lease's id) tells a sender
whether the segment is still lent to it.

Layout (native int64 words, then text): words 0-15 the header (token, progress, ack, asleep), then
(offset, length) of each part's JSON description in the text area, and the answer at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import time

import numpy as np

CTRL_BYTES = 64 << 10       # reserved at the end of every lent segment
MAX_PARTS = 1000            # part slots (a message in more parts uses larger parts)
_TOKEN, _PROGRESS, _ACK, _ASLEEP = 0, 1, 2, 3
_SLOTS = 16                 # first word of the part table
_TEXT = (_SLOTS + 2 * MAX_PARTS) * 8
_ANSWER = 4 << 10           # the answer's area (last bytes of the block)
POLL_IDLE_S = 0.002         # the receiver stops polling after this long without a new part
POLL_SPIN_S = 0.0001        # between parts the receiver polls this long, then sleeps until the next ring
# x86 keeps stores in order (TSO): a reader that sees ``progress`` sees the part before it. Elsewhere
# (ARM) only what a doorbell ring announced is read: the datagram's syscalls order memory.
ORDERED = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
ACK_SPIN_S = 0.0002         # a sender that rang polls this long for the answer before it sleeps


def token_of(xid: str) -> int:
    """The lease id's token (a positive int64)."""
    return int(xid[:15], 16)


def fits(ntensors: int, nparts: int) -> bool:
    """Whether the parts' descriptions fit the text area (a part: ~45 bytes per tensor at most)."""
    return nparts <= MAX_PARTS and 64 * nparts + 48 * ntensors <= CTRL_BYTES - _TEXT - _ANSWER


def ack_spin_s(nbytes: int) -> float:
    """How long a sender polls for the answer before asking on the socket."""
    return 0.001 + nbytes / 10e9


class Control:
    """A view of one segment's control block (``block``: its last ``CTRL_BYTES`` as uint8)."""

    def __init__(self, block: np.ndarray):
        self.block = block
        self.words = block[:_TEXT].view(np.int64)
        self._cursor = _TEXT

    # receiver
    def reset(self, token: int) -> None:
        """Lend the segment afresh: no parts, no answer, this lease's token."""
        self.words[:_SLOTS] = 0
        self.words[_TOKEN] = token

    def progress(self) -> int:
        return int(self.words[_PROGRESS])

    def sleeping(self, asleep: bool) -> None:
        """The receiver stops (or resumes) polling: the sender rings each part while it sleeps."""
        self.words[_ASLEEP] = int(asleep)

    def part(self, i: int) -> dict:
        off, n = int(self.words[_SLOTS + 2 * i]), int(self.words[_SLOTS + 2 * i + 1])
        if not _TEXT <= off <= off + n <= CTRL_BYTES - _ANSWER:
            raise ValueError(f"part {i} description out of bounds")
        return json.loads(self.block[off:off + n].tobytes())

    def answer(self, reply: list[bytes]) -> None:
        text = json.dumps([f.decode("latin-1") for f in reply]).encode()
        if len(text) > _ANSWER - 8:
            text = json.dumps([reply[0].decode("latin-1"), reply[1][:_ANSWER // 2].decode("latin-1")]).encode()
        end = CTRL_BYTES
        self.block[end - _ANSWER:end - _ANSWER + 8].view(np.int64)[0] = len(text)
        self.block[end - _ANSWER + 8:end - _ANSWER + 8 + len(text)] = np.frombuffer(text, np.uint8)
        self.words[_ACK] = 1  # last: the answer is whole before the sender may read it

    # sender
    def claim(self, token: int) -> bool:
        """Whether the segment is still lent under ``token`` (then: start writing parts)."""
        self._cursor = _TEXT
        return int(self.words[_TOKEN]) == token and int(self.words[_PROGRESS]) == 0 and int(self.words[_ACK]) == 0

    def publish(self, i: int, desc: dict) -> None:
        """Part ``i`` is written: its description, then the progress the receiver polls."""
        text = json.dumps(desc).encode()
        off = self._cursor
        if off + len(text) > CTRL_BYTES - _ANSWER:
            raise ValueError("part descriptions overflow the control block")
        self.block[off:off + len(text)] = np.frombuffer(text, np.uint8)
        self.words[_SLOTS + 2 * i], self.words[_SLOTS + 2 * i + 1] = off, len(text)
        self._cursor = off + len(text)
        self.words[_PROGRESS] = i + 1  # last: the part and its description are written before

    def asleep(self) -> bool:
        """Whether the receiver said it sleeps until the next ring (polling, it needs none)."""
        return bool(self.words[_ASLEEP])

    def reply(self) -> list[bytes] | None:
        if not self.words[_ACK]:
            return None
        base = CTRL_BYTES - _ANSWER
        n = int(self.block[base:base + 8].view(np.int64)[0])
        return [f.encode("latin-1") for f in json.loads(self.block[base + 8:base + 8 + n].tobytes())]

    async def wait_reply(self, limit_s: float) -> list[bytes] | None:
        """Poll for the receiver's answer up to ``limit_s``, yielding between looks (None: not yet)."""
        end = time.monotonic() + limit_s
        while True:
            reply = self.reply()
            if reply is not None or time.monotonic() > end:
                return reply
            await pause()


async def pause() -> None:
    """One look's pause while polling: the event loop gets a turn, the core another thread."""
    os.sched_yield()
    await asyncio.sleep(0)
