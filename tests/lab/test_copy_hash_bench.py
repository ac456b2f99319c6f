"""lab/benchmarks/bench_copy_hash.py: the hand-off's copy and checksum variants, timed."""

from __future__ import annotations

import bench_copy_hash

from epdctl.runtime.fast import native_copy


def test_the_copy_bench_times_every_variant_and_restores_the_library():
    """Each variant timed on a real KV message, the library put back."""
    dll = native_copy.library()
    assert dll is not None, "the CI image installs gcc (scripts/test.sh); without cc xxhash hashes"
    got = bench_copy_hash.measure(1, 2, 1)
    assert set(got) == {"numpy copy, then xxhash", "memcpy (no checksum)", "receiver's check", "fused copy + XXH3 (C)"}
    assert all(0 < best <= median for best, median in got.values())
    assert native_copy.library() is dll
