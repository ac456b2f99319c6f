"""Decode attention alone on the decode step's shapes: slot_attention vs the alternatives tried, vs a plain read.

Measured, not asserted. A real KVSlots table (tiny model's shapes: 6 layers, 2 KV heads, 4 query
heads, head dim 32) holds 16 sequences whose lengths spread over [width/3, width); each variant
runs one step's attention over all 6 layers on the batch's view (SlotCache.update's), with the
query laid out as transformers' q_proj leaves it. Rounds alternate over the variants; each
variant's least CPU time (``time.thread_time``, one torch thread) of ``--rounds`` is reported, per
step and per stream, with the KV bytes a step reads (every row to the batch's width) at a plain
read's rate beside it: the read floor. The alternatives (each checked equal to SDPA first):
K stored transposed ([slots, kv_heads, dim, capacity], so q @ K
is a plain strided GEMM), the batch's K/V contiguous (what a table sized to the batch's width
would give), bmm over [n * kv_heads] 3-d views (no copy), one fused baddbmm (scale on q, mask as the
addend, expanded once per step), K @ q^T (the width as the GEMM's long side), each row alone
at its own length (no padded columns read, one op chain per row), transformers' SDPA, and
native_attention.py's C loop (what the decode engine runs where the host can build it).

    .venv/bin/python lab/benchmarks/bench_slot_attention.py [--widths 160 300 500 700] [--rounds 21]
Writes lab/benchmarks/results/slot_attention.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402

from epdctl.runtime.kv_slots import KVSlots, SlotCache  # noqa: E402
from epdctl.runtime.fast.native_attention import attend, kernel  # noqa: E402
from epdctl.runtime.fast.slot_attention import slot_attention  # noqa: E402
from epdctl.runtime.kv_slots import additive_mask  # noqa: E402

LAYERS, KV_HEADS, HEADS, DIM, STREAMS = 6, 2, 4, 32, 16


class _Attn(torch.nn.Module):
    num_key_value_groups = HEADS // KV_HEADS
    is_causal = True


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[2], t.shape[3])  # a view of the slot table's batch (rows and heads merge)


def bmm_3d(query, key, value, mask):
    n, heads, _, dim = query.shape
    scores = torch.bmm(query.reshape(n * KV_HEADS, heads // KV_HEADS, dim), _flat(key).transpose(1, 2))
    scores.mul_(dim ** -0.5)
    scores.view(n, KV_HEADS, -1, scores.shape[-1]).add_(mask)
    return torch.bmm(torch.softmax(scores, dim=-1), _flat(value)).view(n, 1, heads, dim)


def baddbmm_fused(query, key, value, mask3):
    n, heads, _, dim = query.shape
    scores = torch.baddbmm(mask3, query.reshape(n * KV_HEADS, heads // KV_HEADS, dim) * dim ** -0.5,
                           _flat(key).transpose(1, 2))
    return torch.bmm(torch.softmax(scores, dim=-1), _flat(value)).view(n, 1, heads, dim)


def k_at_q(query, key, value, mask):
    n, heads, _, dim = query.shape
    q_t = query.reshape(n * KV_HEADS, heads // KV_HEADS, dim).transpose(1, 2)
    scores = torch.bmm(_flat(key), q_t).transpose(1, 2).reshape(n, KV_HEADS, -1, key.shape[2])
    return torch.matmul(torch.softmax(scores * dim ** -0.5 + mask, dim=-1), value).reshape(n, 1, heads, dim)


def row_by_row(query, key, value, cols):
    n, heads, _, dim = query.shape
    out = []
    for i, last in enumerate(cols.tolist()):
        k, v = key[i, :, :last + 1], value[i, :, :last + 1]
        scores = torch.matmul(query[i].reshape(KV_HEADS, -1, dim), k.transpose(-1, -2)).mul_(dim ** -0.5)
        out.append(torch.matmul(torch.softmax(scores, dim=-1), v))
    return torch.stack(out).reshape(n, 1, heads, dim)


def k_transposed(query, key_t, value, mask):
    """K kept as [n, kv_heads, dim, width] (a view of a [slots, kv_heads, dim, capacity] table)."""
    n, heads, _, dim = query.shape
    scores = torch.matmul(query.reshape(n, KV_HEADS, heads // KV_HEADS, dim), key_t).mul_(dim ** -0.5).add_(mask)
    return torch.matmul(torch.softmax(scores, dim=-1), value).reshape(n, 1, heads, dim)


def setup(width: int) -> tuple[list, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, KVSlots]:
    g = torch.Generator().manual_seed(width)
    slots = KVSlots(LAYERS, KV_HEADS, DIM, torch.float32, slots=STREAMS, capacity=1024)
    lengths = torch.randint(width // 3, width - 1, (STREAMS,), generator=g).tolist()
    lengths[0] = width - 1
    for i, n in enumerate(lengths):
        slots.add(f"s{i}", [(torch.randn(1, KV_HEADS, n, DIM, generator=g),) * 2 for _ in range(LAYERS)], room=1)
    cache = SlotCache(slots, STREAMS)
    views = [cache.update(torch.randn(STREAMS, KV_HEADS, 1, DIM, generator=g),
                          torch.randn(STREAMS, KV_HEADS, 1, DIM, generator=g), layer) for layer in range(LAYERS)]
    proj = torch.randn(STREAMS, 1, HEADS * DIM, generator=g)
    query = proj.view(STREAMS, 1, HEADS, DIM).transpose(1, 2)  # as transformers' attention layers pass it
    seen = (torch.arange(cache.width).view(1, -1) <= cache.cols.view(-1, 1)).view(STREAMS, 1, 1, cache.width)
    return views, query, additive_mask(cache.cols, cache.width, torch.float32), seen, cache.cols, slots


def build(width: int, module: torch.nn.Module) -> tuple[list, dict[str, Callable]]:
    """The batch's per-layer (K, V) views and every variant as ``fn(k, v) -> output``."""
    views, query, mask, seen, cols, slots = setup(width)
    dll = kernel()  # native_attention.py's C loop (what the decode engine runs where it builds)
    t_tables = [table.transpose(-1, -2).contiguous() for table in slots.keys]  # [slots, kv_heads, dim, capacity]
    k_t = {id(k): t[:STREAMS, :, :, :width] for (k, _), t in zip(views, t_tables)}  # by the layer's K view
    packed = {id(k): (k.contiguous(), v.contiguous()) for k, v in views}
    mask3 = mask.expand(STREAMS, KV_HEADS, HEADS // KV_HEADS, mask.shape[-1]).reshape(STREAMS * KV_HEADS, -1,
                                                                                      mask.shape[-1])
    return views, {
        "slot_attention": lambda k, v: slot_attention(module, query, k, v, mask)[0],
        "K transposed": lambda k, v: k_transposed(query, k_t[id(k)], v, mask),
        "contiguous batch": lambda k, v: slot_attention(module, query, *packed[id(k)], mask)[0],
        "bmm 3-d": lambda k, v: bmm_3d(query, k, v, mask),
        "baddbmm fused": lambda k, v: baddbmm_fused(query, k, v, mask3),
        "K @ q^T": lambda k, v: k_at_q(query, k, v, mask),
        "row by row": lambda k, v: row_by_row(query, k, v, cols),
        "sdpa": lambda k, v: sdpa_attention_forward(module, query, k, v, seen)[0],
        **({"native C loop": lambda k, v: attend(dll, query, k, v, cols + 1, DIM ** -0.5)} if dll is not None else {}),
    }


def check(views: list, variants: dict[str, Callable]) -> None:
    """Every variant computes what SDPA computes (else its time would not compare)."""
    want = [variants["sdpa"](k, v) for k, v in views]
    for name, fn in variants.items():
        for (k, v), w in zip(views, want):
            if not torch.allclose(fn(k, v).reshape(w.shape), w, atol=1e-5):
                raise AssertionError(f"{name} differs from SDPA")


def plain_read_s(views: list, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.thread_time()
        for k, v in views:
            k.sum(), v.sum()
        best = min(best, time.thread_time() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[160, 300, 500, 700])
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--out", default=str(ROOT / "lab" / "benchmarks" / "results" / "slot_attention.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    module, rows = _Attn(), []
    print(f"{'width':>5} {'variant':>18} {'ms/step':>8} {'us/stream':>10} {'x floor':>8}")
    for width in args.widths:
        views, variants = build(width, module)
        check(views, variants)
        best = dict.fromkeys(variants, float("inf"))
        with torch.inference_mode():
            for _ in range(args.rounds):
                for name, fn in variants.items():
                    t = time.thread_time()
                    for k, v in views:
                        fn(k, v)
                    best[name] = min(best[name], time.thread_time() - t)
        floor = plain_read_s(views, args.rounds)
        for name, s in [*best.items(), ("plain read (floor)", floor)]:
            rows.append({"width": width, "variant": name, "ms_per_step": s * 1e3, "us_per_stream": s * 1e6 / STREAMS,
                         "x_floor": s / floor})
            print(f"{width:5d} {name:>18} {s * 1e3:8.3f} {s * 1e6 / STREAMS:10.1f} {s / floor:7.1f}x")
    print(f"{STREAMS} streams, {LAYERS} layers, 1 thread, load {os.getloadavg()[0]:.2f}; least CPU time of "
          f"{args.rounds} alternating rounds")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {"rounds": args.rounds, "load_avg_1m": os.getloadavg()[0], "rows": rows}
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
