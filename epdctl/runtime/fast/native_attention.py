"""A decode step's attention as one small C loop per layer, built on this host at first use.

Why: torch runs a step's attention as MKL GEMMs on 2 query rows per KV head, several times what
reading the KV costs, every row read to the batch's padded width (lab/benchmarks/bench_slot_attention.py lists the layouts
tried). This loop reads each row's keys and values once, only to that row's own length, and
writes the output in the layout the o_proj reads. A second function writes the step's new K/V
into the slots (kv_slots.SlotCache), a third takes the argmax of all-greedy steps (sampling.py).

How: the C source below is compiled with the host's ``cc`` (-O3 -march=native, vectorised exp
via glibc's libmvec) into a private per-user cache (native_build.py: named by a hash of source,
flags and the CPU, written under a temporary name, then renamed) and called through ctypes. No compiler, a failed
build or ``EPDCTL_NATIVE_ATTENTION=0`` leaves ``kernel()`` None and the torch path in
slot_attention.py runs instead (same tokens: the engine's tests compare both with each sequence
decoded alone). fp32 only; other dtypes take the torch path.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from typing import Any

import torch

from . import native_build
from .native_build import cpu_id

log = logging.getLogger(__name__)

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ACC_DIM 256 /* head dims up to this accumulate the output in a local array (the compiler keeps
                       it out of memory the kernel writes through) */

#if defined(__GNUC__) && !defined(__clang__)
#define DOT16 1
/* 16 keys' scores at once without 16 horizontal sums: each key's products stay a 16-lane vector,
   then four rounds of pairwise shuffles + adds fold the 16 vectors into one (lane l = key
   bitreverse(l)), unscrambled by one last shuffle. GCC lowers the vectors to the host's width. */
typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i16 __attribute__((vector_size(64)));
static inline v16 load16(const float *p) { v16 r; memcpy(&r, p, sizeof r); return r; }
static v16 dot16(const float *restrict qg, const float *restrict K, int64_t dim) {
    static const i16 lo1 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    static const i16 lo2 = {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27};
    static const i16 lo3 = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
    static const i16 lo4 = {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30};
    static const i16 rev = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
    v16 a[16];
    for (int t = 0; t < 16; t++) {
        v16 acc = {0};
        for (int64_t c = 0; c < dim; c += 16) acc += load16(qg + c) * load16(K + t * dim + c);
        a[t] = acc;
    }
    for (int t = 0; t < 8; t++) a[t] = __builtin_shuffle(a[2 * t], a[2 * t + 1], lo1) + __builtin_shuffle(a[2 * t], a[2 * t + 1], lo1 + 8);
    for (int t = 0; t < 4; t++) a[t] = __builtin_shuffle(a[2 * t], a[2 * t + 1], lo2) + __builtin_shuffle(a[2 * t], a[2 * t + 1], lo2 + 4);
    for (int t = 0; t < 2; t++) a[t] = __builtin_shuffle(a[2 * t], a[2 * t + 1], lo3) + __builtin_shuffle(a[2 * t], a[2 * t + 1], lo3 + 2);
    return __builtin_shuffle(__builtin_shuffle(a[0], a[1], lo4) + __builtin_shuffle(a[0], a[1], lo4 + 1), rev);
}
#endif

/* probs @ V for head dims of C 16-lane chunks: the output row stays in C registers (a loop that
   adds into memory waits on its own stores every column). */
#define PV_FIXED(C)                                                                                          \
    static void pv_##C(int64_t len, const float *restrict s, const float *restrict V, float *restrict O) {    \
        v16 acc[C] = {{0}};                                                                                 \
        for (int64_t j = 0; j < len; j++) {                                                                 \
            const v16 p = (v16){0} + s[j];                                                                      \
            for (int c = 0; c < C; c++) acc[c] += p * load16(V + j * 16 * C + 16 * c);                      \
        }                                                                                                   \
        memcpy(O, acc, sizeof acc);                                                                         \
    }
#ifdef DOT16
PV_FIXED(2)
PV_FIXED(4)
PV_FIXED(8)
#endif

/* One row's one KV head: its group of queries over columns 0..len-1, K and V read once. */
static void head_attend(int64_t len, int64_t group, int64_t dim, const float *restrict Q, const float *restrict K,
                        const float *restrict V, float scale, float *restrict scores, float *restrict O) {
    int64_t j = 0;
#ifdef DOT16
    if (dim % 16 == 0)
        for (; j + 16 <= len; j += 16) {
            for (int64_t g = 0; g < group; g++) {
                const v16 s = dot16(Q + g * dim, K + j * dim, dim) * scale;
                memcpy(scores + g * len + j, &s, sizeof s);
            }
        }
#endif
    for (; j < len; j++) {
        const float *restrict kj = K + j * dim;
        for (int64_t g = 0; g < group; g++) {
            const float *restrict qg = Q + g * dim;
            float acc = 0.0f;
#pragma omp simd reduction(+:acc)
            for (int64_t d = 0; d < dim; d++) acc += qg[d] * kj[d];
            scores[g * len + j] = acc * scale;
        }
    }
    for (int64_t g = 0; g < group; g++) {
        float *restrict s = scores + g * len;
        float top = s[0], sum = 0.0f;
        for (int64_t j = 1; j < len; j++) top = s[j] > top ? s[j] : top;
#pragma omp simd reduction(+:sum)
        for (int64_t j = 0; j < len; j++) { s[j] = expf(s[j] - top); sum += s[j]; }
        const float inv = 1.0f / sum;
#pragma omp simd
        for (int64_t j = 0; j < len; j++) s[j] *= inv;
    }
#ifdef DOT16
    if (dim == 32 || dim == 64 || dim == 128) {
        for (int64_t g = 0; g < group; g++)
            (dim == 32 ? pv_2 : dim == 64 ? pv_4 : pv_8)(len, scores + g * len, V, O + g * dim);
        return;
    }
#endif
    for (int64_t g = 0; g < group; g++) {
        const float *restrict s = scores + g * len;
        float acc[ACC_DIM];
        float *restrict o = dim <= ACC_DIM ? acc : O + g * dim;
        for (int64_t d = 0; d < dim; d++) o[d] = 0.0f;
        for (int64_t j = 0; j < len; j++) {
            const float p = s[j];
            const float *restrict vj = V + j * dim;
#pragma omp simd
            for (int64_t d = 0; d < dim; d++) o[d] += p * vj[d];
        }
        if (o == acc) memcpy(O + g * dim, acc, sizeof(float) * (size_t)dim);
    }
}

/* q, out: [n, heads, dim] contiguous. k, v: row i, kv head h, column j at
   base + i*slot_stride + h*head_stride + j*dim. lengths[i]: columns row i attends over (>= 1).
   Head h reads kv head h / (heads / kv_heads), as transformers' repeat_kv orders them. */
int epd_slot_attention_f32(int64_t n, int64_t heads, int64_t kv_heads, int64_t dim, const float *q,
                           const float *k, const float *v, int64_t slot_stride, int64_t head_stride,
                           const int64_t *lengths, float scale, float *out) {
    const int64_t group = heads / kv_heads;
    int64_t most = 1;
    for (int64_t i = 0; i < n; i++) most = lengths[i] > most ? lengths[i] : most;
    float *scores = malloc(sizeof(float) * (size_t)(group * most));
    if (!scores) return -1;
    for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < kv_heads; h++)
            head_attend(lengths[i], group, dim, q + (i * heads + h * group) * dim,
                        k + i * slot_stride + h * head_stride, v + i * slot_stride + h * head_stride, scale, scores,
                        out + (i * heads + h * group) * dim);
    free(scores);
    return 0;
}

/* A step's new keys and values (sk, sv: [n, kv_heads, dim] contiguous) into the slot tables, row i
   at column cols[i] (one call per layer instead of torch's index arithmetic and index_copy_s). */
void epd_slot_write_f32(int64_t n, int64_t kv_heads, int64_t dim, const float *sk, const float *sv, float *k,
                        float *v, int64_t slot_stride, int64_t head_stride, const int64_t *cols) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < kv_heads; h++) {
            const int64_t at = i * slot_stride + h * head_stride + cols[i] * dim, from = (i * kv_heads + h) * dim;
            memcpy(k + at, sk + from, sizeof(float) * (size_t)dim);
            memcpy(v + at, sv + from, sizeof(float) * (size_t)dim);
        }
}

/* out[i] = argmax of row i of x [n, vocab]: the first largest; a NaN wins (torch.argmax's rule; bit test under
   -ffast-math). Two passes (the max, vectorised; then its first index) instead of one branchy scalar loop. */
void epd_argmax_f32(int64_t n, int64_t vocab, const float *x, int64_t *out) {
    for (int64_t i = 0; i < n; i++) {
        const float *r = x + i * vocab;
        float top = r[0];
        uint32_t nan = 0, bits;
        for (int64_t j = 0; j < vocab; j++) {
            memcpy(&bits, r + j, sizeof bits);
            nan |= (bits & 0x7fffffffu) > 0x7f800000u;
            top = r[j] > top ? r[j] : top;
        }
        int64_t best = 0;
        for (int64_t j = 0; j < vocab; j++) {
            memcpy(&bits, r + j, sizeof bits);
            if (nan ? (bits & 0x7fffffffu) > 0x7f800000u : r[j] == top) { best = j; break; }
        }
        out[i] = best;
    }
}
"""
# Compiled and linked in two steps: linking a shared library with -ffast-math (gcc < 13) adds
# crtfastmath.o, whose constructor would switch the whole process (torch too) to flush-to-zero.
FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp-simd", "-fPIC")
LIBS = ("-lmvec", "-lm")
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_ARGTYPES: list[Any] = [_I64, _I64, _I64, _I64, _PTR, _PTR, _PTR, _I64, _I64, _PTR, ctypes.c_float, _PTR]
_WRITE_ARGTYPES: list[Any] = [_I64, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _PTR]


def _build() -> ctypes.CDLL:
    # cpu_id is looked up here (tests stand in another CPU by replacing this module's name)
    dll = native_build.build("slot_attention", SOURCE, FLAGS, LIBS, cpu_id())
    dll.epd_slot_attention_f32.argtypes = _ARGTYPES
    dll.epd_slot_attention_f32.restype = ctypes.c_int
    dll.epd_slot_write_f32.argtypes = _WRITE_ARGTYPES
    dll.epd_slot_write_f32.restype = None
    dll.epd_argmax_f32.argtypes = [_I64, _I64, _PTR, _PTR]
    dll.epd_argmax_f32.restype = None
    return dll


_state: dict[str, object] = {}


def kernel() -> ctypes.CDLL | None:
    """The built library, or None (disabled, no compiler, or the build failed: logged once)."""
    return native_build.load_once(_state, "EPDCTL_NATIVE_ATTENTION", _build, log, "torch's attention")


@dataclass(frozen=True)
class RowLengths:
    """What a native decode step passes as its attention mask: the columns each row attends over
    (int64 [n]: its length before the step + the new token) and the library that reads them."""
    valid: torch.Tensor
    dll: ctypes.CDLL


def attend(dll: ctypes.CDLL, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, lengths: torch.Tensor,
           scaling: float) -> torch.Tensor:
    """query [n, heads, 1, dim]; key/value [n, kv_heads, width, dim] views of one slot table each
    (columns contiguous, same strides); lengths int64 [n], columns each row reads. Returns
    [n, 1, heads, dim] like transformers' attention functions."""
    n, heads, _, dim = query.shape
    q = query.reshape(n, heads, dim).contiguous()
    out = torch.empty(n, 1, heads, dim, dtype=torch.float32)
    ss, hs, cs, ds = key.stride()
    if cs != dim or ds != 1 or value.stride() != key.stride():
        raise ValueError("native attention needs K/V views with contiguous columns and equal strides")
    rc = dll.epd_slot_attention_f32(n, heads, key.shape[1], dim, q.data_ptr(), key.data_ptr(), value.data_ptr(),
                                    ss, hs, lengths.data_ptr(), scaling, out.data_ptr())
    if rc:
        raise MemoryError("native decode attention: out of memory for its scores")
    return out


def write(dll: ctypes.CDLL, key: torch.Tensor, value: torch.Tensor, k_table: torch.Tensor, v_table: torch.Tensor,
          cols: torch.Tensor) -> None:
    """key/value [n, kv_heads, 1, dim] (one new token per row) into contiguous fp32 slot tables
    [slots, kv_heads, capacity, dim], row i at column cols[i] (int64) of slot i."""
    n, heads, _, dim = key.shape
    if not (k_table.is_contiguous() and v_table.is_contiguous() and k_table.dtype == v_table.dtype == torch.float32):
        raise ValueError("native KV write needs contiguous fp32 slot tables")
    sk, sv = key.reshape(n, heads, dim).contiguous(), value.reshape(n, heads, dim).contiguous()
    ss, hs, _, _ = k_table.stride()
    dll.epd_slot_write_f32(n, heads, dim, sk.data_ptr(), sv.data_ptr(), k_table.data_ptr(), v_table.data_ptr(), ss, hs,
                           cols.data_ptr())

