"""Turn a run's samples (and metric deltas) into the report: percentiles, throughput, errors.

The JSON written by ``epdctl bench --json`` is exactly :func:`summarize`'s dict (plus the
per-request samples), so other tools can read one stable shape:

``{"workload", "target", "wall_s", "requests", "ok", "errors", "error_kinds",
"throughput": {"requests_per_s", "output_tokens_per_s", "images_per_s"},
"ttft_ms"/"tpot_ms"/"latency_ms": {"p50","p90","p99","mean","max"},
"stages_ms": {"encode_ms": {...}, ...}, "correct", "metrics", "stage_means_s"}``
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Sequence

from epdctl.bench.client import ZERO_TOKENS, Sample

PERCENTILES = (50, 90, 99)
STAGE_KEYS = ("encode_ms", "prefill_ms", "kv_transfer_ms", "kv_wait_ms", "decode_ms", "ttft_ms",
              "total_ms", "kv_bytes", "embedding_bytes")


def percentile(xs: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (no interpolation: every value reported was really seen)."""
    if not xs:
        return None
    s = sorted(xs)
    k = min(len(s) - 1, max(0, math.ceil(p / 100.0 * len(s)) - 1))
    return s[k]


def dist(xs: Sequence[float], scale: float = 1000.0) -> dict[str, float | None]:
    """p50/p90/p99/mean/max of ``xs`` (seconds -> ms by default), rounded for reading."""
    out: dict[str, float | None] = {}
    for p in PERCENTILES:
        v = percentile(xs, p)
        out[f"p{p}"] = None if v is None else round(v * scale, 3)
    out["mean"] = round(sum(xs) / len(xs) * scale, 3) if xs else None
    out["max"] = round(max(xs) * scale, 3) if xs else None
    out["n"] = len(xs)
    return out


def _error_kind(err: str) -> str:
    if err.startswith(ZERO_TOKENS):
        return ZERO_TOKENS
    return err.split(":", 1)[0] if err else "unknown"


def summarize(samples: list[Sample], wall: float, *, workload: str = "", target: str = "",
              offered_rate: float | None = None, concurrency: int | None = None,
              metrics: dict[str, dict[str, float]] | None = None,
              stage_means: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    """The report of one run."""
    ok = [s for s in samples if s.ok]
    bad = [s for s in samples if not s.ok]
    wall = max(wall, 1e-9)
    stages: dict[str, Any] = {}
    for key in STAGE_KEYS:
        vals = [s.timings[key] for s in ok if key in s.timings]
        if vals:
            stages[key] = dist(vals, scale=1.0)
    judged = [s for s in ok if s.correct is not None]
    return {
        "workload": workload,
        "target": target,
        "offered_rate": offered_rate,
        "concurrency": concurrency,
        "wall_s": round(wall, 3),
        "requests": len(samples),
        "ok": len(ok),
        "errors": len(bad),
        "error_kinds": dict(Counter(_error_kind(s.error) for s in bad)),
        "first_errors": [s.error for s in bad[:5]],
        "throughput": {
            "requests_per_s": round(len(ok) / wall, 4),
            "output_tokens_per_s": round(sum(s.completion_tokens for s in ok) / wall, 3),
            "images_per_s": round(sum(s.n_images for s in ok) / wall, 3),
        },
        "ttft_ms": dist([s.ttft for s in ok if s.ttft is not None]),
        "tpot_ms": dist([s.tpot for s in ok if s.tpot is not None]),
        "latency_ms": dist([s.latency for s in ok if s.latency is not None]),
        "output_tokens": dist([float(s.completion_tokens) for s in ok], scale=1.0),
        "stages_ms": stages,
        "correct": {"judged": len(judged), "correct": sum(1 for s in judged if s.correct),
                    "cut_off": len(ok) - len(judged)},
        "metrics": metrics or {},
        "stage_means_s": stage_means or {},
    }


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def format_report(r: dict[str, Any]) -> list[str]:
    """Human-readable lines for one run (what `epdctl bench` prints)."""
    t = r["throughput"]
    lines = [
        f"{r['workload']} -> {r['target']}",
        f"  requests {r['requests']}  ok {r['ok']}  errors {r['errors']}"
        + (f" {r['error_kinds']}" if r["errors"] else "") + f"  wall {r['wall_s']:.1f}s",
        f"  throughput {t['requests_per_s']:.3f} req/s  {t['output_tokens_per_s']:.1f} tok/s  "
        f"{t['images_per_s']:.2f} img/s",
    ]
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("latency_ms", "E2E ")):
        d = r[key]
        lines.append(f"  {label} ms  p50 {_ms(d['p50'])}  p90 {_ms(d['p90'])}  p99 {_ms(d['p99'])}"
                     f"  mean {_ms(d['mean'])}")
    if r["stages_ms"]:
        parts = [f"{k[:-3] if k.endswith('_ms') else k} {v['p50']:.1f}"
                 for k, v in r["stages_ms"].items() if not k.endswith("_bytes")]
        lines.append("  stages p50 ms  " + "  ".join(parts))
    c = r["correct"]
    if c["judged"] or c.get("cut_off"):
        cut = (f" ({c['cut_off']} cut off by max_tokens, not judged)"
               if c.get("cut_off") else "")
        lines.append(f"  answers correct {c['correct']}/{c['judged']}{cut}")
    for e in r.get("first_errors") or []:
        lines.append(f"  error: {e}")
    return lines
