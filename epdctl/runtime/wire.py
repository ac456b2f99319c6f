"""One wire format for every transport: a JSON header, then one raw buffer per tensor.

The header lists each tensor's name, dtype, shape, byte size and checksum and the total, so a
receiver detects a truncated or corrupted hand-off and raises ``TransferError`` instead of
decoding garbage into a plausible-looking (and silently wrong) answer.

The checksum is XXH3-64 (PyPI ``xxhash``), chosen because it hashes faster than a memcpy copies,
so checking costs less than the copy (lab/benchmarks/bench_transfer.py prints the comparison). The
fast path may install an accelerator (``use_accelerator``, fast/native_copy.py) that gives the
same values in C.
Received tensors are views into the received buffers when those are writable and aligned: no
copy after the wire.
"""

from __future__ import annotations

import ctypes
import json
from typing import Protocol, Sequence

import numpy as np
import torch
import xxhash

from .encoder_engine import EncodedImage
from .errors import TransferError
from .prefill_engine import PrefillResult

MAGIC = "epd-wire/3"  # 3: parts carry one checksum per span (transports/spans.py)
_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool)}

Frame = bytes | memoryview


class Accelerator(Protocol):
    """A faster way to the same XXH3-64 values; each call may decline (None) and xxhash runs."""

    def checksum(self, buf: Frame, nbytes: int) -> int | None: ...

    def copy_hash(self, bufs: Sequence[Frame], dst: np.ndarray, offsets: Sequence[int],
                  lengths: list[int]) -> int | None: ...

    def span_sum(self, buf: memoryview, offsets: Sequence[int], lengths: Sequence[int]) -> int | None: ...


ACCEL: Accelerator | None = None  # set once per process by the fast path


def use_accelerator(accel: Accelerator | None) -> None:
    """Hash (and copy-and-hash) through ``accel`` from now on in this process; None: xxhash only."""
    global ACCEL
    ACCEL = accel


def checksum(buf: Frame) -> int:
    """XXH3-64 of ``buf`` (any contiguous buffer)."""
    if ACCEL is not None:
        digest = ACCEL.checksum(buf, memoryview(buf).nbytes)
        if digest is not None:
            return digest
    return xxhash.xxh3_64_intdigest(buf)


_NAMES = {d: n for n, d in _DTYPES.items()}
_ITEMSIZE = {n: torch.empty(0, dtype=d).element_size() for n, d in _DTYPES.items()}


_ANY = ctypes.c_uint8 * (1 << 40)  # one array type for every size (ctypes caches each size's type forever)


def _raw(t: torch.Tensor) -> memoryview:
    """The tensor's bytes without a copy (contiguous CPU tensors; others are made so first): a
    ctypes array at its address, cut to its size (cheaper than a numpy or torch view, and a KV
    message has dozens of tensors). The array holds the tensor, so the memoryview keeps it alive."""
    if not t.is_cpu:
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    n = t.nbytes
    if n == 0:
        return memoryview(b"")
    arr = _ANY.from_address(t.data_ptr())
    arr._owner = t  # type: ignore[attr-defined]
    return memoryview(arr)[:n]


def describe(meta: dict, tensors: dict[str, torch.Tensor]) -> tuple[dict, list[memoryview]]:
    """The header (checksums not yet filled in) and each tensor's bytes (zero-copy views)."""
    table, bufs = [], []
    for name, t in tensors.items():
        dtype = _NAMES.get(t.dtype)
        if dtype is None:
            raise TransferError(f"tensor {name!r}: dtype {str(t.dtype).removeprefix('torch.')} cannot be sent")
        raw = _raw(t)
        table.append({"name": name, "dtype": dtype, "shape": list(t.shape), "nbytes": raw.nbytes})
        bufs.append(raw)
    return {"magic": MAGIC, "meta": meta, "tensors": table, "total": sum(b.nbytes for b in bufs)}, bufs


def pack(meta: dict, tensors: dict[str, torch.Tensor]) -> list[Frame]:
    """Header frame (JSON bytes) followed by one buffer per tensor, in header order (zero-copy views)."""
    header, bufs = describe(meta, tensors)
    for entry, raw in zip(header["tensors"], bufs):
        entry["xxh3"] = checksum(raw)
    return [json.dumps(header).encode(), *bufs]


def parse_header(frame: Frame) -> dict:
    try:
        header = json.loads(bytes(frame))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TransferError(f"wire header is not valid JSON ({exc}); corrupt or foreign message") from exc
    if not isinstance(header, dict) or header.get("magic") != MAGIC:
        raise TransferError(f"wire header lacks magic {MAGIC!r}; corrupt message or version mismatch")
    return header


def _check(entry: dict, mv: memoryview) -> torch.dtype:
    nbytes = entry["nbytes"]
    if mv.nbytes != nbytes:
        raise TransferError(f"tensor {entry['name']!r} truncated: {mv.nbytes} of {nbytes} bytes")
    if checksum(mv) != entry.get("xxh3"):
        raise TransferError(f"tensor {entry['name']!r} corrupt: checksum (XXH3-64) mismatch")
    dtype = _DTYPES.get(entry["dtype"])
    if dtype is None:
        raise TransferError(f"tensor {entry['name']!r}: unknown dtype {entry['dtype']!r}")
    numel = 1
    for d in entry["shape"]:
        numel *= int(d)
    if numel * _ITEMSIZE[entry["dtype"]] != nbytes:
        raise TransferError(f"tensor {entry['name']!r}: shape {entry['shape']} does not match {nbytes} bytes")
    return dtype


def _view_or_copy(mv: memoryview, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    """A tensor over ``mv`` without copying when it is writable and aligned for ``dtype``; else a copy."""
    if mv.nbytes and not mv.readonly:
        arr = np.frombuffer(mv, dtype=np.uint8)
        if arr.ctypes.data % 8 == 0:
            return torch.from_numpy(arr).view(dtype).view(shape)
    t = torch.empty(shape, dtype=dtype)
    if mv.nbytes:
        np.copyto(t.reshape(-1).view(torch.uint8).numpy(), np.frombuffer(mv, dtype=np.uint8))
    return t


def tensor_from(entry: dict, mv: memoryview) -> torch.Tensor:
    """One tensor's bytes checked against its header ``entry`` (size, checksum, shape), as a view
    of ``mv`` when writable and aligned, else a copy."""
    return _view_or_copy(mv, _check(entry, mv), entry["shape"])


def unpack(frames: Sequence[Frame]) -> tuple[dict, dict[str, torch.Tensor]]:
    """Validate sizes and checksums; tensors are views into writable frames (copies of read-only ones)."""
    if not frames:
        raise TransferError("empty wire message")
    header = parse_header(frames[0])
    table = header["tensors"]
    if len(frames) - 1 != len(table):
        raise TransferError(f"wire message truncated: {len(frames) - 1} buffers for {len(table)} tensors")
    tensors: dict[str, torch.Tensor] = {}
    for entry, buf in zip(table, frames[1:]):
        mv = memoryview(buf).cast("B")
        tensors[entry["name"]] = _view_or_copy(mv, _check(entry, mv), entry["shape"])
    return header["meta"], tensors


ALIGN = 64


def layout(table: list[dict]) -> tuple[list[int], int]:
    """Offsets of each tensor in one contiguous buffer (64-byte aligned, so dtype views work)."""
    offsets, off = [], 0
    for entry in table:
        offsets.append(off)
        off += -(-entry["nbytes"] // ALIGN) * ALIGN
    return offsets, off


def unpack_contiguous(header_frame: Frame | dict, buf: torch.Tensor) -> tuple[dict, dict[str, torch.Tensor]]:
    """Like ``unpack`` for a message laid out by ``layout`` in a uint8 tensor this process owns:
    validated, then returned as views into ``buf`` (no copy). ``header_frame`` may be already parsed."""
    header = header_frame if isinstance(header_frame, dict) else parse_header(header_frame)
    table = header["tensors"]
    offsets, total = layout(table)
    need = offsets[-1] + table[-1]["nbytes"] if table else 0  # the last tensor's padding may be absent
    if buf.numel() < need:
        raise TransferError(f"wire message truncated: buffer of {buf.numel()} bytes, layout needs {need}")
    raw = buf.numpy().data  # = memoryview(ndarray), typed (numpy stubs lack __buffer__ before 3.12)
    typed: dict[torch.dtype, torch.Tensor] = {}  # buf as each dtype once: a tensor is then one as_strided
    tensors: dict[str, torch.Tensor] = {}
    for entry, off in zip(table, offsets):
        dtype = _check(entry, raw[off:off + entry["nbytes"]])
        shape = entry["shape"]
        whole = typed.get(dtype)
        if whole is None:
            size = _ITEMSIZE[entry["dtype"]]
            whole = typed[dtype] = buf[:min(total, buf.numel()) // size * size].view(dtype)
        size = _ITEMSIZE[entry["dtype"]]
        strides, step = [], 1
        for d in reversed(shape):
            strides.append(step)
            step *= int(d)
        tensors[entry["name"]] = whole.as_strided(shape, strides[::-1], whole.storage_offset() + off // size)
    return header["meta"], tensors


def fill(header_frame: Frame, bufs: Sequence[Frame], dst: np.ndarray) -> list[int]:
    """Copy ``bufs`` into ``dst`` at ``layout``'s offsets (the sender's half of a one-buffer hand-off).

    Returns each buffer's length as sent; an over-long (damaged) buffer is cut at its slot so it
    never spills into the next one, and the receiver's ``unpack_written`` reports it.
    """
    offsets, total = layout(parse_header(header_frame)["tensors"])
    if dst.nbytes < total:
        raise TransferError(f"destination buffer of {dst.nbytes} bytes is smaller than the message ({total})")
    lengths = []
    for buf, off, end in zip(bufs, offsets, offsets[1:] + [total]):
        src = np.frombuffer(buf, dtype=np.uint8)
        n = min(src.nbytes, end - off)
        dst[off:off + n] = src[:n]
        lengths.append(src.nbytes)
    return lengths


def unpack_written(header_frame: Frame, buf: torch.Tensor, lengths: list[int]) -> tuple[dict, dict[str, torch.Tensor]]:
    """``unpack_contiguous`` after checking the sender wrote every buffer whole (``fill``'s lengths)."""
    header = parse_header(header_frame)
    expected = [t["nbytes"] for t in header["tensors"]]
    if lengths != expected:
        raise TransferError(f"transfer truncated: wrote {sum(lengths)} of {sum(expected)} bytes "
                            f"({len(lengths)} of {len(expected)} buffers)")
    return unpack_contiguous(header, buf)


def kv_to_tensors(result: PrefillResult) -> tuple[dict, dict[str, torch.Tensor]]:
    meta = {"kind": "kv", "first_token": result.first_token, "rope_delta": result.rope_delta,
            "prompt_len": result.prompt_len, "layers": len(result.kv)}
    tensors = {"first_logits": result.first_logits}
    for i, (k, v) in enumerate(result.kv):
        tensors[f"k{i}"] = k
        tensors[f"v{i}"] = v
    return meta, tensors


def tensors_to_prefill_result(meta: dict, tensors: dict[str, torch.Tensor]) -> PrefillResult:
    try:
        kv = [(tensors[f"k{i}"], tensors[f"v{i}"]) for i in range(int(meta["layers"]))]
        return PrefillResult(first_token=int(meta["first_token"]), first_logits=tensors["first_logits"], kv=kv,
                             rope_delta=int(meta["rope_delta"]), prompt_len=int(meta["prompt_len"]))
    except KeyError as exc:
        raise TransferError(f"KV message lacks {exc}; sender and receiver run different versions") from exc


def embeds_to_tensors(images: list[EncodedImage]) -> tuple[dict, dict[str, torch.Tensor]]:
    meta = {"kind": "embeds", "images": [{"digest": e.digest, "grid_thw": list(e.grid_thw), "cached": e.cached}
                                         for e in images]}
    return meta, {f"img{i}": e.embeds for i, e in enumerate(images)}


def tensors_to_embeds(meta: dict, tensors: dict[str, torch.Tensor]) -> list[EncodedImage]:
    try:
        return [EncodedImage(digest=m["digest"], embeds=tensors[f"img{i}"], grid_thw=tuple(m["grid_thw"]),
                             cached=bool(m["cached"])) for i, m in enumerate(meta["images"])]
    except KeyError as exc:
        raise TransferError(f"embedding message lacks {exc}; sender and receiver run different versions") from exc
