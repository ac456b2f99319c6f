"""lab/benchmarks/bench_slot_attention.py times equal work: every variant's output equals SDPA's on the
bench's own batch (a real KVSlots table's strided views), and its check catches a variant that differs."""

from __future__ import annotations

import pytest

import bench_slot_attention as bench


@pytest.mark.parametrize("width", [24, 97])
def test_every_variant_computes_what_sdpa_computes(width):
    views, variants = bench.build(width, bench._Attn())
    assert len(views) == bench.LAYERS
    k, _ = views[0]
    assert k.shape == (bench.STREAMS, bench.KV_HEADS, width, bench.DIM)
    assert not k.is_contiguous()  # the slot table's view, as the decode step reads it
    assert "native C loop" in variants  # the engine's own path where it builds (here: it does)
    bench.check(views, variants)
    variants["bmm 3-d"] = lambda k, v, f=variants["bmm 3-d"]: f(k, v) * 1.001
    with pytest.raises(AssertionError, match="bmm 3-d"):
        bench.check(views, variants)

