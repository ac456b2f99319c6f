"""One checksum per part: a run of tensors laid out by ``wire.layout`` is copied and hashed,
and on arrival checked and viewed, as one span.

A part's checksum is XXH3-64 over its tensors' bytes in order (the layout's padding left out),
so the same value describes a socket frame, a run in a shared segment, or one tensor's own
memory (a part of one tensor: exactly its bytes). The sender copies each piece with numpy and
hashes it right after, while it is in cache; the fast path swaps in a one-pass C copy and hash
(``wire.use_accelerator``, fast/native_copy.py) that gives the same value, so either end may
run either. The receiver hashes the span's tensors in one streaming pass and makes every tensor
a view of it: one digest per part instead of one per tensor, and the receiver's per-tensor dtype
and shape checks run once per message (``plan``), not per part.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import torch
import xxhash

from .. import wire
from ..errors import TransferError
from ..wire import _DTYPES, _ITEMSIZE, Frame

CHUNK = 512 * 1024  # copy, then hash, in pieces that stay in cache between the two


def write_span(bufs: Sequence[Frame], offsets: list[int], dst: np.ndarray, first: int,
               last: int) -> tuple[int, list[int]]:
    """Copy tensors ``first..last-1`` to their ``offsets`` in ``dst``, hashing the source as it is
    copied (numpy then xxhash per cached piece, or the accelerator's one pass); (the part's
    checksum, each tensor's length)."""
    lengths = [memoryview(bufs[i]).nbytes for i in range(first, last)]
    if last > first and offsets[last - 1] + lengths[-1] > dst.nbytes:
        raise TransferError(f"destination of {dst.nbytes} bytes is smaller than the part's layout")
    if wire.ACCEL is not None:
        digest = wire.ACCEL.copy_hash([bufs[i] for i in range(first, last)], dst, offsets[first:last], lengths)
        if digest is not None:
            return digest, lengths
    h = xxhash.xxh3_64()
    for i, n in zip(range(first, last), lengths):
        src = np.frombuffer(bufs[i], dtype=np.uint8)
        off = offsets[i]
        if n <= CHUNK:
            dst[off:off + n] = src
            h.update(src.data)
            continue
        for start in range(0, n, CHUNK):
            piece = src[start:start + CHUNK]
            dst[off + start:off + start + piece.nbytes] = piece
            h.update(piece.data)
    return h.intdigest(), lengths


def span_sum(buf: memoryview, offsets: Sequence[int], lengths: Sequence[int]) -> int:
    """The part checksum of tensors at ``offsets`` (relative to ``buf``) of ``lengths`` bytes."""
    if any(off < 0 or off + n > buf.nbytes for off, n in zip(offsets, lengths)):
        raise TransferError(f"part of {buf.nbytes} bytes is shorter than its layout")
    if wire.ACCEL is not None:
        digest = wire.ACCEL.span_sum(buf, offsets, lengths)
        if digest is not None:
            return digest
    h = xxhash.xxh3_64()
    for off, n in zip(offsets, lengths):
        h.update(buf[off:off + n])
    return h.intdigest()


class View(NamedTuple):
    """How one tensor is read out of a span: its name, dtype, item size, shape and strides."""
    name: str
    dtype: torch.dtype
    itemsize: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]


def plan(table: list[dict]) -> list[View]:
    """Check every header entry once (known dtype, shape that matches its bytes)."""
    out = []
    for entry in table:
        dtype = _DTYPES.get(entry["dtype"])
        if dtype is None:
            raise TransferError(f"tensor {entry.get('name')!r}: unknown dtype {entry['dtype']!r}")
        shape = tuple(map(int, entry["shape"]))
        strides, step = [], 1
        for d in reversed(shape):
            strides.append(step)
            step *= d
        size = _ITEMSIZE[entry["dtype"]]
        if step * size != entry["nbytes"]:
            raise TransferError(f"tensor {entry.get('name')!r}: shape {list(shape)} does not match "
                                f"{entry['nbytes']} bytes")
        strides.reverse()
        out.append(View(str(entry["name"]), dtype, size, shape, tuple(strides)))
    return out


def views(plans: Sequence[View], offsets: Sequence[int], span: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each tensor as a view of ``span`` (uint8, already checked) at ``offsets`` (relative to it):
    the span viewed once per dtype, then one ``as_strided`` per tensor."""
    typed: dict[torch.dtype, torch.Tensor] = {}
    out: dict[str, torch.Tensor] = {}
    for (name, dtype, itemsize, shape, strides), off in zip(plans, offsets):
        whole = typed.get(dtype)
        if whole is None:
            whole = typed[dtype] = span[:span.numel() // itemsize * itemsize].view(dtype)
        out[name] = whole.as_strided(shape, strides, whole.storage_offset() + off // itemsize)
    return out
