"""A message in parts: cut at tensor boundaries, each part checked on its own as it arrives.

``split`` cuts a message laid out by ``wire.layout`` into parts of about ``PART_BYTES`` (a tensor
is never split; with ``direct_bytes`` a large tensor is a part of its own, sent from its own
memory). Every part carries the lengths the sender wrote and its checksum: one over the part's
tensors (``sum``, ``spans.py``: what ``send()`` writes) or one per tensor (``sums``: a packed
message's own header checksums, ``send_frames()``), (``part_header``); ``Incoming`` checks each
part against the message's header as it comes and remembers the first damage, and ``finish``
hands out the tensors (views of the received buffers) only when every part arrived whole and in
order, so a corrupt, truncated or missing part fails both ``send()`` and the receiver's
``recv()``. Parts of ~2 MiB let writing, moving and checking a large message overlap, each part
still in cache (L2/L3) when the next stage reads it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np
import torch

from ..errors import TransferError
from ..wire import MAGIC, Frame, checksum, layout, tensor_from, unpack_contiguous
from .spans import View, plan, span_sum, views, write_span

PART_BYTES = 2 << 20  # parts of ~2 MiB: writing, the wire and the check overlap, each part still in cache (L2/L3)



def split(table: list[dict], offsets: list[int], total: int, part_bytes: int = PART_BYTES,
          direct_bytes: int | None = None) -> list[tuple[int, int]]:
    """Tensor ranges [first, last) of about ``part_bytes`` each, in order, covering ``table``; with
    ``direct_bytes``, every tensor that large is a part of its own (sent from its own memory)."""
    parts: list[tuple[int, int]] = []
    first = 0
    ends = offsets[1:] + [total]
    for i in range(len(table)):
        if direct_bytes is not None and table[i]["nbytes"] >= direct_bytes and first < i:
            parts.append((first, i))
            first = i
        big = direct_bytes is not None and table[i]["nbytes"] >= direct_bytes
        if big or ends[i] - offsets[first] >= part_bytes or i == len(table) - 1:
            parts.append((first, i + 1))
            first = i + 1
    return parts or [(0, 0)]


def span(offsets: list[int], total: int, first: int, last: int) -> tuple[int, int]:
    """Byte range of tensors [first, last) in the layout."""
    return (offsets[first] if first < len(offsets) else total), (offsets[last] if last < len(offsets) else total)


Sums = int | list[int]  # one checksum for the part's span (spans.py), or one per tensor (the header's)


class Writer(Protocol):
    def __call__(self, dst: np.ndarray, first: int, last: int) -> tuple[Sums, list[int]]:
        """Write tensors [first, last) at their offsets in ``dst``; their checksum(s) and lengths."""

    def direct(self, i: int) -> tuple[Frame, int, int]:
        """Tensor ``i`` as it is (no copy): its bytes, checksum and length."""


class TensorWriter:
    """``send()``'s writer: copy a run of tensors and hash the span written (one checksum per
    part, cache-hot), or hand a large tensor out as it is with its checksum."""

    def __init__(self, table: list[dict], bufs: Sequence[memoryview], offsets: list[int]):
        self.table, self.bufs, self.offsets = table, bufs, offsets

    def __call__(self, dst: np.ndarray, first: int, last: int) -> tuple[Sums, list[int]]:
        return write_span(self.bufs, self.offsets, dst, first, last)

    def direct(self, i: int) -> tuple[Frame, int, int]:
        return self.bufs[i], checksum(self.bufs[i]), self.bufs[i].nbytes


class FrameWriter:
    """``send_frames()``'s writer: already-packed buffers with the header's own checksums. An
    over-long (damaged) buffer is cut at its slot, a missing one written as nothing; the lengths
    report both, so the receiver names the damage."""

    def __init__(self, table: list[dict], bufs: Sequence[Frame], offsets: list[int], total: int):
        self.table, self.bufs, self.offsets, self.ends = table, bufs, offsets, offsets[1:] + [total]

    def __call__(self, dst: np.ndarray, first: int, last: int) -> tuple[Sums, list[int]]:
        lengths = []
        for i in range(first, last):
            if i >= len(self.bufs):
                lengths.append(-1)
                continue
            src = np.frombuffer(self.bufs[i], dtype=np.uint8)
            n = min(src.nbytes, self.ends[i] - self.offsets[i])
            dst[self.offsets[i]:self.offsets[i] + n] = src[:n]
            lengths.append(src.nbytes)
        return [int(e.get("xxh3", -1)) for e in self.table[first:last]], lengths

    def direct(self, i: int) -> tuple[Frame, int, int]:
        if i >= len(self.bufs):
            return b"", int(self.table[i].get("xxh3", -1)), -1
        return self.bufs[i], int(self.table[i].get("xxh3", -1)), memoryview(self.bufs[i]).nbytes


def part_header(first: int, sums: Sums, lengths: list[int]) -> dict:
    """A part's description: its first tensor, the lengths written, and its checksum (``sum``:
    over its span) or checksums (``sums``: one per tensor, as in a packed message's header)."""
    return {"first": first, ("sum" if isinstance(sums, int) else "sums"): sums, "lengths": lengths}


@dataclass
class Incoming:
    """The receiver's state of one pipelined message: parts checked so far, or the first error."""
    key: str
    header: dict
    offsets: list[int]
    total: int
    started: float = field(default_factory=time.monotonic)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    next_first: int = 0
    received: int = 0
    error: TransferError | None = None
    plans: list[View] = field(default_factory=list)

    @classmethod
    def open(cls, key: str, header: dict) -> "Incoming":
        """The receiving state for ``header``; an entry it cannot read (dtype, shape) is its error."""
        offsets, total = layout(header["tensors"])
        incoming = cls(key, header, offsets, total)
        try:
            incoming.plans = plan(header["tensors"])
        except TransferError as exc:
            incoming.error = exc
        except (ValueError, KeyError, TypeError) as exc:
            incoming.error = TransferError(f"malformed header of {key!r}: {exc}")
        return incoming

    def add(self, part: dict, buf: memoryview, whole: bool) -> None:
        """Check one part: ``part`` its header (``part_header``), ``buf`` its bytes (``whole``: the
        whole layout, as in a shared segment). A damaged part is remembered, not raised: ``finish``
        reports it."""
        if self.error is not None:
            return
        try:
            self._add(part, buf, whole)
        except TransferError as exc:
            self.error = exc
        except (ValueError, KeyError, TypeError) as exc:
            self.error = TransferError(f"malformed part of {self.key!r}: {exc}")

    def size_of(self, desc: dict) -> int:
        """Bytes a part's header says it covers (0 if it is malformed: ``add`` then says why)."""
        try:
            start, end = span(self.offsets, self.total, int(desc["first"]), int(desc["first"]) + len(desc["lengths"]))
            return max(0, end - start)
        except (ValueError, KeyError, TypeError, IndexError):
            return 0

    def _add(self, part: dict, buf: memoryview, whole: bool) -> None:
        first, lengths = int(part["first"]), list(part["lengths"])
        table = self.header["tensors"]
        last = first + len(lengths)
        sums = list(part["sums"]) if "sums" in part else None
        if first != self.next_first or last > len(table) or (sums is not None and len(sums) != len(lengths)):
            raise TransferError(f"transfer of {self.key!r} truncated or out of order: part for tensors "
                                f"{first}..{last - 1} after {self.next_first} of {len(table)}")
        entries = table[first:last]
        expected = [e["nbytes"] for e in entries]
        if lengths != expected:
            wrote = sum(max(n, 0) for n in lengths)
            raise TransferError(f"transfer truncated: wrote {wrote} of {sum(expected)} bytes in tensors "
                                f"{first}..{last - 1} ({sum(n >= 0 for n in lengths)} of {len(entries)} buffers)")
        start, end = span(self.offsets, self.total, first, last)
        base = start if whole else 0
        need = self.offsets[last - 1] - start + entries[-1]["nbytes"] if entries else 0  # no padding after the last
        if buf.nbytes < base + need:
            raise TransferError(f"transfer of {self.key!r} truncated: part of {buf.nbytes - base} bytes, "
                                f"layout needs {need}")
        if sums is None:  # one checksum for the part
            rel = [o - start for o in self.offsets[first:last]]
            if span_sum(buf[base:base + need], rel, expected) != int(part["sum"]):
                raise TransferError(f"transfer of {self.key!r} corrupt: checksum (XXH3-64) mismatch in tensors "
                                    f"{first}..{last - 1}")
            if entries:
                self.tensors.update(views(self.plans[first:last], rel, _as_tensor(buf[base:base + need])))
        elif len(entries) == 1:  # a tensor of its own (a direct frame): check it and view it
            entry = dict(entries[0], xxh3=sums[0])
            self.tensors[entry["name"]] = tensor_from(entry, buf[base:base + need])
        else:
            sub = {"magic": MAGIC, "meta": {}, "tensors": [dict(e, xxh3=s) for e, s in zip(entries, sums)]}
            view = _as_tensor(buf[base:base + end - start] if end - start <= buf.nbytes - base else buf[base:])
            self.tensors.update(unpack_contiguous(sub, view)[1])
        self.next_first = last
        self.received += need

    def finish(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """The message, once every part arrived whole; else the TransferError that says what broke."""
        if self.error is not None:
            raise self.error
        n = len(self.header["tensors"])
        if self.next_first != n:
            raise TransferError(f"transfer of {self.key!r} truncated: {self.next_first} of {n} tensors arrived")
        return self.header["meta"], self.tensors


def _as_tensor(buf: memoryview) -> torch.Tensor:
    """``buf`` as a uint8 tensor without copying (copied only if read-only or misaligned)."""
    arr = np.frombuffer(buf, dtype=np.uint8)
    if buf.readonly or arr.ctypes.data % 8:
        arr = arr.copy()
    return torch.from_numpy(arr)
