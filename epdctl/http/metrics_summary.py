"""Key figures of a worker or the router from one Prometheus scrape (pure; no I/O).

Why a separate module: `epdctl status` shows the same figures as `epdctl bench` and the
Grafana dashboard (requests, TTFT/TPOT quantiles, queue, embedding-cache hit rate, bytes
moved), and the arithmetic (quantiles from cumulative buckets, hit rates, role totals) is
easiest to trust when it is tested on recorded ``/metrics`` text. Samples come from
``epdctl.http.metrics.parse`` (``name{labels}`` -> value), whose ``labels`` reads a key's labels.
All figures are
cumulative since the process started, not over a window.
"""

from __future__ import annotations

import math
from typing import Any

from epdctl.http.metrics import labels as _labels, name_of as _base


def total(samples: dict[str, float], name: str, **match: str) -> float | None:
    """Sum of every series called ``name`` whose labels include ``match``; None when absent."""
    vals = [v for k, v in samples.items()
            if _base(k) == name and all(_labels(k).get(a) == b for a, b in match.items())]
    return sum(vals) if vals else None


def buckets(samples: dict[str, float], name: str) -> list[tuple[float, float]]:
    """``(upper bound, cumulative count)`` of histogram ``name``, summed over label sets."""
    by_le: dict[float, float] = {}
    for k, v in samples.items():
        if _base(k) != name + "_bucket":
            continue
        bound = _labels(k).get("le")
        if bound is None:
            continue
        le = math.inf if bound in ("+Inf", "Inf") else float(bound)
        by_le[le] = by_le.get(le, 0.0) + v
    return sorted(by_le.items())


def quantile(q: float, bkts: list[tuple[float, float]]) -> float | None:
    """Prometheus ``histogram_quantile``: linear interpolation inside the bucket holding rank q.

    None when the histogram is empty. A rank in the +Inf bucket answers the largest finite
    bound (the histogram cannot say more).
    """
    if not bkts or bkts[-1][1] <= 0:
        return None
    count = bkts[-1][1]
    rank = q * count
    lower, below = 0.0, 0.0
    for bound, cum in bkts:
        if cum >= rank and cum > below:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (cum - below)
        if not math.isinf(bound):
            lower = bound
        below = cum
    return lower


def hit_rate(hits: float | None, misses: float | None) -> float | None:
    """hits / (hits + misses); None when nothing was looked up."""
    if hits is None and misses is None:
        return None
    looked = (hits or 0.0) + (misses or 0.0)
    return (hits or 0.0) / looked if looked else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def vllm_figures(samples: dict[str, float]) -> dict[str, Any]:
    """The figures of one vLLM server from its own series (vllm/v1/metrics/loggers.py): finished
    requests, TTFT and inter-token latency quantiles, KV cache usage, running/waiting requests,
    and the prompt tokens its KV connector loaded from another worker (``external_kv_transfer``)."""
    tpot = buckets(samples, "vllm:inter_token_latency_seconds") or buckets(
        samples, "vllm:time_per_output_token_seconds")
    ttft = buckets(samples, "vllm:time_to_first_token_seconds")
    return {"requests": total(samples, "vllm:request_success_total"),
            "ttft_p50_ms": _ms(quantile(0.5, ttft)), "ttft_p99_ms": _ms(quantile(0.99, ttft)),
            "tpot_p50_ms": _ms(quantile(0.5, tpot)), "cache_hit_rate": None, "bytes_sent": None,
            "kv_cache_usage": total(samples, "vllm:kv_cache_usage_perc"),
            "running": total(samples, "vllm:num_requests_running"),
            "waiting": total(samples, "vllm:num_requests_waiting"),
            "prompt_tokens": total(samples, "vllm:prompt_tokens_total"),
            "external_kv_tokens": total(samples, "vllm:prompt_tokens_by_source_total",
                                        source="external_kv_transfer")}


def sglang_figures(samples: dict[str, float]) -> dict[str, Any]:
    """The figures of one SGLang server from its own series (``--enable-metrics``;
    sglang/srt/observability/metrics_collector.py): finished requests, TTFT and inter-token latency
    quantiles (per output token), the radix cache's hit rate."""
    ttft = buckets(samples, "sglang:time_to_first_token_seconds")
    # inter-token latency is observed on streamed requests only; the per-request mean covers the rest
    tpot = buckets(samples, "sglang:inter_token_latency_seconds") or buckets(
        samples, "sglang:request_time_per_output_token_seconds")
    return {"requests": total(samples, "sglang:num_requests_total"),
            "ttft_p50_ms": _ms(quantile(0.5, ttft)), "ttft_p99_ms": _ms(quantile(0.99, ttft)),
            "tpot_p50_ms": _ms(quantile(0.5, tpot)),
            "cache_hit_rate": total(samples, "sglang:cache_hit_rate"), "bytes_sent": None}


def worker_figures(role: str, samples: dict[str, float]) -> dict[str, Any]:
    """The figures of one worker: a vLLM server's (``vllm:*`` series), an SGLang server's
    (``sglang:*``) or a runtime worker's (series ``epd_<role>_*``); absent ones are None."""
    if any(k.startswith("vllm:") for k in samples):
        return vllm_figures(samples)
    if any(k.startswith("sglang:") for k in samples):
        return sglang_figures(samples)
    p = f"epd_{role}"
    ok = total(samples, f"{p}_requests_total", status="200")
    if role == "encoder":
        ok = total(samples, f"{p}_requests_total", outcome="200")
    out: dict[str, Any] = {"requests": ok, "ttft_p50_ms": None, "ttft_p99_ms": None,
                           "tpot_p50_ms": None, "cache_hit_rate": None, "bytes_sent": None}
    if role in ("decode", "colocated"):
        ttft = buckets(samples, f"{p}_ttft_seconds")
        out["ttft_p50_ms"] = _ms(quantile(0.5, ttft))
        out["ttft_p99_ms"] = _ms(quantile(0.99, ttft))
        out["tpot_p50_ms"] = _ms(quantile(0.5, buckets(samples, f"{p}_tpot_seconds")))
    if role == "encoder":
        out["cache_hit_rate"] = hit_rate(total(samples, f"{p}_cache_hits_total"),
                                         total(samples, f"{p}_cache_misses_total"))
    elif role == "colocated":
        out["cache_hit_rate"] = hit_rate(total(samples, f"{p}_embedding_cache_hits_total"),
                                         total(samples, f"{p}_embedding_cache_misses_total"))
    if role in ("encoder", "prefill"):
        sent = [total(samples, f"{p}_{k}_bytes_sent_total") for k in ("transport", "inline")]
        out["bytes_sent"] = None if all(v is None for v in sent) else sum(v or 0 for v in sent)
    return out


def role_figures(role: str, scraped: list[dict[str, float]]) -> dict[str, Any]:
    """One summary per role: counts and bytes added up, quantiles from the merged buckets."""
    merged: dict[str, float] = {}
    for s in scraped:
        for k, v in s.items():
            merged[k] = merged.get(k, 0.0) + v
    out = worker_figures(role, merged)
    out["workers"] = len(scraped)
    return out


def router_figures(samples: dict[str, float]) -> dict[str, Any]:
    """smg's request count (request-duration histogram count) and TTFT p50."""
    return {"requests": total(samples, "smg_router_request_duration_seconds_count"),
            "ttft_p50_ms": _ms(quantile(0.5, buckets(samples, "smg_pd_ttft_seconds")))}
