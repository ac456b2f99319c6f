"""A hand-off's copy and checksum in one pass, as a small C function built on this host at first use.

Why: the sender of a checked hand-off copies each tensor into the wire buffer (a send buffer or a
shared segment) and hashes it. Done as a numpy copy and then python ``xxhash`` over each cached
piece, that is two passes in series, and ``xxhash`` holds the GIL. Here every 64-byte stripe is loaded once, stored to the destination
and folded into the hash, in one loop called through ctypes (without the GIL for large inputs).

What: the checksum is XXH3-64 with the default secret and seed, the same value python ``xxhash``
gives for the concatenation of the pieces (``xxh3_64_intdigest``), so the wire format does not
change: a receiver without this library (no compiler, ``EPDCTL_NATIVE_COPY=0``, not built yet)
verifies a native sender's parts with ``xxhash``, and the other way round. Only inputs of more
than 240 bytes take the C path (XXH3's long-input algorithm, a few dozen lines); shorter ones
and every fallback use ``xxhash``. The loop is AVX-512 or AVX2 (x86 hosts); elsewhere it does
not build and numpy + xxhash run (a plain-C loop is slower than xxhash's own SIMD).

Where it pays: copy + hash in one pass costs about a plain copy (lab/benchmarks/bench_copy_hash.py
compares). Hashing alone it is no faster than python ``xxhash``, so checks use it only where
releasing the GIL matters: buffers of ``NOGIL_HASH_BYTES`` or more, which the
receiver verifies in a worker thread (transports/base.py) while its event loop keeps serving.
The same sizes decide whether a call releases the GIL (ctypes.CDLL) or keeps it (PyDLL): a
shorter call runs on the event loop's thread, where handing the GIL to another thread (pyzmq's
frame collector) for a few microseconds risks getting it back only after that thread's next
time slice on a busy host.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any, Sequence

import numpy as np

from . import native_build

log = logging.getLogger(__name__)

SOURCE = r"""
#include <stdint.h>
#include <string.h>
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "little-endian hosts only: elsewhere the caller hashes with xxhash"
#endif
#if !defined(__AVX2__)
#error "AVX2 or AVX-512 hosts only: elsewhere python xxhash (with its own SIMD) is faster"
#endif
#include <immintrin.h>

#define P32_1 0x9E3779B1ULL
#define P64_1 0x9E3779B185EBCA87ULL
/* XXH3's default secret (a constant of the algorithm) */
static const uint8_t SECRET[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e};

static inline uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* One stripe: 64 bytes d folded into the 8 lanes with the secret at sec (a lane gets its
   neighbour's data plus the product of its keyed data's two 32-bit halves), and the scramble
   after each 16th stripe; as AVX-512 or AVX2, whichever the host has. */
#if defined(__AVX512F__)
typedef __m512i Lanes;
#define LOAD_LANES(acc) _mm512_loadu_si512(acc)
#define STORE_LANES(acc, a) _mm512_storeu_si512(acc, a)
static inline Lanes step(Lanes a, const uint8_t *src, uint8_t *dst, const uint8_t *sec) {
    const __m512i d = _mm512_loadu_si512(src);
    if (dst) _mm512_storeu_si512(dst, d);
    const __m512i k = _mm512_xor_si512(d, _mm512_loadu_si512(sec));
    return _mm512_add_epi64(a, _mm512_add_epi64(_mm512_mul_epu32(k, _mm512_shuffle_epi32(k, (_MM_PERM_ENUM)0x31)),
                                                _mm512_shuffle_epi32(d, (_MM_PERM_ENUM)0x4e)));
}
static inline Lanes scramble(Lanes a) {
    const __m512i prime = _mm512_set1_epi32((int)P32_1);
    a = _mm512_xor_si512(_mm512_xor_si512(a, _mm512_srli_epi64(a, 47)), _mm512_loadu_si512(SECRET + 128));
    return _mm512_add_epi64(_mm512_mul_epu32(a, prime),
                            _mm512_slli_epi64(_mm512_mul_epu32(_mm512_shuffle_epi32(a, (_MM_PERM_ENUM)0x31), prime), 32));
}
#else
typedef struct { __m256i lo, hi; } Lanes;
#define LOAD_LANES(acc) ((Lanes){_mm256_loadu_si256((const __m256i *)(acc)), _mm256_loadu_si256((const __m256i *)((acc) + 4))})
#define STORE_LANES(acc, a) (_mm256_storeu_si256((__m256i *)(acc), (a).lo), _mm256_storeu_si256((__m256i *)((acc) + 4), (a).hi))
static inline __m256i half(__m256i a, const uint8_t *src, uint8_t *dst, const uint8_t *sec) {
    const __m256i d = _mm256_loadu_si256((const __m256i *)src);
    if (dst) _mm256_storeu_si256((__m256i *)dst, d);
    const __m256i k = _mm256_xor_si256(d, _mm256_loadu_si256((const __m256i *)sec));
    return _mm256_add_epi64(a, _mm256_add_epi64(_mm256_mul_epu32(k, _mm256_shuffle_epi32(k, 0x31)),
                                                _mm256_shuffle_epi32(d, 0x4e)));
}
static inline Lanes step(Lanes a, const uint8_t *src, uint8_t *dst, const uint8_t *sec) {
    return (Lanes){half(a.lo, src, dst, sec), half(a.hi, src + 32, dst ? dst + 32 : NULL, sec + 32)};
}
static inline __m256i scramble_half(__m256i a, const uint8_t *sec) {
    const __m256i prime = _mm256_set1_epi32((int)P32_1);
    a = _mm256_xor_si256(_mm256_xor_si256(a, _mm256_srli_epi64(a, 47)), _mm256_loadu_si256((const __m256i *)sec));
    return _mm256_add_epi64(_mm256_mul_epu32(a, prime),
                            _mm256_slli_epi64(_mm256_mul_epu32(_mm256_shuffle_epi32(a, 0x31), prime), 32));
}
static inline Lanes scramble(Lanes a) { return (Lanes){scramble_half(a.lo, SECRET + 128), scramble_half(a.hi, SECRET + 160)}; }
#endif

/* n stripes of 64 bytes from src (each also stored to dst unless it is NULL) into the lanes:
   the secret moves 8 bytes a stripe, and the lanes are scrambled after every 16th (one block). */
static void stripes(uint64_t *acc, int64_t *stripe, const uint8_t *src, uint8_t *dst, int64_t n) {
    Lanes a = LOAD_LANES(acc);
    while (n > 0) {
        const int64_t at = *stripe % 16, k = n < 16 - at ? n : 16 - at;
        const uint8_t *sec = SECRET + 8 * at;
        if (dst) {
            for (int64_t j = 0; j < k; j++) a = step(a, src + 64 * j, dst + 64 * j, sec + 8 * j);
            dst += 64 * k;
        } else {
            for (int64_t j = 0; j < k; j++) a = step(a, src + 64 * j, NULL, sec + 8 * j);
        }
        src += 64 * k;
        n -= k;
        *stripe += k;
        if (at + k == 16) a = scramble(a);
    }
    STORE_LANES(acc, a);
}

static uint64_t avalanche(uint64_t h) {
    h ^= h >> 37;
    h *= 0x165667919E3779F9ULL;
    return h ^ (h >> 32);
}

/* XXH3-64 (default secret, seed 0) of the n pieces src[i] (len[i] bytes) taken in order, together
   more than 240 bytes; each piece is copied to dst[i] on the way unless dst is NULL. All but the
   last (partial or whole) stripe are folded in order; that one is always the input's last 64 bytes. */
uint64_t epd_copy_xxh3(int64_t n, const uint64_t *src, const uint64_t *dst, const int64_t *len) {
    uint64_t acc[8] __attribute__((aligned(64))) = {0xC2B2AE3DULL, P64_1, 0xC2B2AE3D27D4EB4FULL, 0x165667B19E3779F9ULL,
                       0x85EBCA77C2B2AE63ULL, 0x85EBCA77ULL, 0x27D4EB2F165667C5ULL, P32_1};
    int64_t total = 0, stripe = 0, pos = 0, fill = 0;
    uint8_t carry[64], last[64];
    for (int64_t i = 0; i < n; i++) total += len[i];
    const int64_t body = (total - 1) / 64 * 64; /* bytes folded stripe by stripe */
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *s = (const uint8_t *)(uintptr_t)src[i];
        uint8_t *d = dst ? (uint8_t *)(uintptr_t)dst[i] : NULL;
        const int64_t m = len[i], take = body - pos < m ? (body - pos > 0 ? body - pos : 0) : m;
        int64_t head = 0, fused = 0;
        if (fill) { /* a stripe that began in an earlier piece */
            head = 64 - fill < take ? 64 - fill : take;
            memcpy(carry + fill, s, (size_t)head);
            fill += head;
            if (fill == 64) {
                stripes(acc, &stripe, carry, NULL, 1);
                fill = 0;
            }
        }
        if (!fill) {
            const int64_t k = (take - head) / 64;
            stripes(acc, &stripe, s + head, d ? d + head : NULL, k);
            fused = 64 * k;
            fill = take - head - fused;
            memcpy(carry, s + head + fused, (size_t)fill);
        }
        if (d) {
            memcpy(d, s, (size_t)head);
            memcpy(d + head + fused, s + head + fused, (size_t)(m - head - fused));
        }
        pos += m;
    }
    for (int64_t i = n - 1, need = 64; i >= 0 && need > 0; i--) { /* the last 64 bytes */
        const int64_t k = len[i] < need ? len[i] : need;
        memcpy(last + need - k, (const uint8_t *)(uintptr_t)src[i] + len[i] - k, (size_t)k);
        need -= k;
    }
    for (int i = 0; i < 8; i++) {
        const uint64_t d = rd64(last + 8 * i), key = d ^ rd64(SECRET + 121 + 8 * i);
        acc[i ^ 1] += d;
        acc[i] += (key & 0xFFFFFFFFULL) * (key >> 32);
    }
    uint64_t h = (uint64_t)total * P64_1;
    for (int i = 0; i < 4; i++) {
        const __uint128_t p = (__uint128_t)(acc[2 * i] ^ rd64(SECRET + 11 + 16 * i)) * (acc[2 * i + 1] ^ rd64(SECRET + 19 + 16 * i));
        h += (uint64_t)p ^ (uint64_t)(p >> 64);
    }
    return avalanche(h);
}

/* XXH3-64 of one buffer (more than 240 bytes) */
uint64_t epd_xxh3(uint64_t src, int64_t len) { return epd_copy_xxh3(1, &src, NULL, &len); }
"""
FLAGS = ("-O3", "-march=native", "-fPIC")
MIN_BYTES = 241  # XXH3's long-input algorithm; shorter inputs are hashed by xxhash
NOGIL_HASH_BYTES = 32 << 20  # checks of this many bytes hash here, without the GIL (smaller: xxhash, faster)
_U64P = ctypes.POINTER(ctypes.c_uint64)
_ARGTYPES: list[Any] = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]


def _build(flags: tuple[str, ...] = FLAGS) -> ctypes.CDLL:
    dll = native_build.build("copy_xxh3", SOURCE, flags, (), native_build.cpu_id())
    held = ctypes.PyDLL(dll._name)  # the same library, called keeping the GIL
    for lib in (dll, held):
        lib.epd_copy_xxh3.argtypes = _ARGTYPES
        lib.epd_copy_xxh3.restype = ctypes.c_uint64
    dll.epd_xxh3.argtypes = [ctypes.c_uint64, ctypes.c_int64]
    dll.epd_xxh3.restype = ctypes.c_uint64
    setattr(dll, "held_copy_xxh3", held.epd_copy_xxh3)
    return dll


_state: dict[str, object] = {}


def library() -> ctypes.CDLL | None:
    """The built library, or None (disabled, no compiler, or the build failed: logged once)."""
    return native_build.load_once(_state, "EPDCTL_NATIVE_COPY", _build, log, "numpy and xxhash")


def address(buf: Any) -> int:
    """The address of a contiguous buffer's first byte (writable ones take the cheaper way)."""
    mv = memoryview(buf)
    if not mv.nbytes:
        return 0
    if not mv.readonly:
        return ctypes.addressof(ctypes.c_char.from_buffer(mv))
    return int(np.frombuffer(mv, dtype=np.uint8).ctypes.data)


def hash_one(dll: ctypes.CDLL, buf: Any, nbytes: int) -> int:
    """XXH3-64 of one contiguous buffer of ``nbytes`` (more than 240) bytes."""
    if nbytes < MIN_BYTES:
        raise ValueError(f"native XXH3 takes inputs of {MIN_BYTES}+ bytes (got {nbytes})")
    return int(dll.epd_xxh3(address(buf), nbytes))


def copy_hash(dll: ctypes.CDLL, src: list[int], dst: list[int] | None, lengths: list[int]) -> int:
    """XXH3-64 of the pieces at addresses ``src`` (``lengths`` bytes each, in order, together more
    than 240 bytes), each copied to its address in ``dst`` on the way (None: hash only). The
    caller keeps every buffer alive and each destination as large as its piece. (Non-temporal
    stores were measured and dropped: the receiver on the other core then reads the part from
    memory, not the shared cache.)"""
    n = len(src)
    if sum(lengths) < MIN_BYTES:
        raise ValueError(f"native XXH3 takes inputs of {MIN_BYTES}+ bytes (got {sum(lengths)})")
    arrays = (ctypes.c_uint64 * n)(*src), (ctypes.c_int64 * n)(*lengths)
    out = (ctypes.c_uint64 * n)(*dst) if dst is not None else None
    # a short call keeps the GIL: another thread that took it meanwhile (pyzmq's frame collector)
    # could hold it, preempted on a busy host, long after the call returned
    fn = dll.epd_copy_xxh3 if sum(lengths) >= NOGIL_HASH_BYTES else getattr(dll, "held_copy_xxh3", dll.epd_copy_xxh3)
    return int(fn(n, arrays[0], out, arrays[1]))


def checker(nbytes: int) -> ctypes.CDLL | None:
    """The library to check ``nbytes`` with, or None for xxhash: only checks large enough to be
    worth running without the GIL (``NOGIL_HASH_BYTES``) use the C loop."""
    return library() if nbytes >= max(NOGIL_HASH_BYTES, MIN_BYTES) else None


class NativeCopyHash:
    """``wire.Accelerator`` through this library: copies and hashes in one pass, and checks large
    buffers without the GIL; declines (None) where xxhash is the better choice."""

    def checksum(self, buf: Any, nbytes: int) -> int | None:
        dll = checker(nbytes)
        return None if dll is None else hash_one(dll, buf, nbytes)

    def copy_hash(self, bufs: Sequence[Any], dst: np.ndarray, offsets: Sequence[int], lengths: list[int]) -> int | None:
        dll = library()
        if dll is None or sum(lengths) < MIN_BYTES:
            return None
        base = address(dst)
        return copy_hash(dll, [address(b) for b in bufs], [base + off for off in offsets], lengths)

    def span_sum(self, buf: memoryview, offsets: Sequence[int], lengths: Sequence[int]) -> int | None:
        dll = checker(sum(lengths))
        if dll is None:
            return None
        base = address(buf)
        return copy_hash(dll, [base + off for off in offsets], None, list(lengths))
