"""Where one request's time to first token goes, from the wall-clock stamps the workers report.

Every worker of the embedded runtime puts ``t_*`` stamps (``time.time()``, one host, so they
compare) into the ``timings`` of its last stream chunk: the prefill and the encoders' stamps
travel to the decode with the KV. This module turns them into consecutive stages whose sum is
the worker-side TTFT; what the client saw on top of it is the router and the client itself.

EPD:       prefill in → (fetch) → encoder POST out → (encoder hop) → encoder in → (encode) →
           embeddings sent → (embeddings) → received → (prefill wait) → prefill start → (prefill)
           → end → (route) → KV leaves → (KV hand-off) → decode has the KV → (first token).
EPD, first token ahead of the KV (kv_handoff.py): ... → (route) → token leaves → (token hand-off)
           → decode has the token → (first token); the KV's own hand-off (``KV after token``,
           route → KV in) then runs beside the stream and is reported outside the sum.
Colocated: worker in → (fetch) → encode start → (encode) → end → (prefill) → end → (first token).
"""

from __future__ import annotations

import statistics
from typing import Any

KV_AFTER_TOKEN = "KV after token"
EPD_STAGES: list[tuple[str, str, str]] = [
    ("fetch", "t_prefill_in", "t_enc_out"),
    ("encoder hop", "t_enc_out", "t_enc_in"),
    ("encode", "t_enc_in", "t_enc_send"),
    ("embeddings", "t_enc_send", "t_emb_in"),
    ("prefill wait", "t_emb_in", "t_prefill_start"),
    ("prefill", "t_prefill_start", "t_prefill_end"),
    ("route", "t_prefill_end", "t_route"),
    ("KV hand-off", "t_route", "t_kv_in"),
    ("first token", "t_kv_in", "t_first"),
]
EPD_EARLY_STAGES: list[tuple[str, str, str]] = EPD_STAGES[:7] + [
    ("token hand-off", "t_route", "t_first_in"),
    ("first token", "t_first_in", "t_first"),
]
COLOCATED_STAGES: list[tuple[str, str, str]] = [
    ("fetch", "t_decode_in", "t_enc_out"),
    ("encode", "t_enc_out", "t_emb_in"),
    ("prefill", "t_emb_in", "t_prefill_end"),
    ("first token", "t_prefill_end", "t_first"),
]


def stages_of(timings: dict[str, float], client_ttft_s: float | None) -> dict[str, float] | None:
    """One request's stages in ms, or None when its stamps are incomplete (an older worker).

    ``worker ttft`` is the worker's own arrival-to-first-token; ``router + client`` is what the
    client measured beyond it (both router hops, the client's own send and parse). In EPD the
    worker clock starts at the earlier of the prefill's and the decode's arrival.
    """
    t = dict(timings)
    if "t_decode_in" not in t or "ttft_ms" not in t:
        return None
    t["t_first"] = t["t_decode_in"] + t["ttft_ms"] / 1000.0
    table = (EPD_EARLY_STAGES if "t_first_in" in t else EPD_STAGES) if "t_prefill_in" in t else COLOCATED_STAGES
    if any(a not in t or b not in t for _, a, b in table):
        return None
    out = {name: (t[b] - t[a]) * 1000.0 for name, a, b in table}
    if table is EPD_EARLY_STAGES and "t_kv_in" in t:  # beside the stream, not on the way to its first token
        out[KV_AFTER_TOKEN] = (t["t_kv_in"] - t["t_route"]) * 1000.0
    start = min(t["t_decode_in"], t.get("t_prefill_in", t["t_decode_in"]))
    out["worker ttft"] = (t["t_first"] - start) * 1000.0
    if client_ttft_s is not None:
        out["router + client"] = client_ttft_s * 1000.0 - out["worker ttft"]
    return out


def breakdown(samples: list[Any]) -> dict[str, float]:
    """Median of every stage over the samples that carry complete stamps (ms, 0.01 ms)."""
    rows = [r for s in samples if s.ok for r in [stages_of(s.timings, s.ttft)] if r is not None]
    if not rows:
        return {}
    names = list(dict.fromkeys(k for r in rows for k in r))  # a request whose KV beat its token has other stages
    return {"n": float(len(rows)),
            **{k: round(statistics.median(r[k] for r in rows if k in r), 2) for k in names}}


def by_images(samples: list[Any]) -> dict[str, dict[str, float]]:
    """``breakdown`` per number of images in the request (keys "4", "8", ...)."""
    counts = sorted({int(s.n_images) for s in samples})
    return {str(n): breakdown([s for s in samples if s.n_images == n]) for n in counts}


def format_breakdown(epd: dict[str, float], colocated: dict[str, float]) -> list[str]:
    """Lines of a two-column table (stages absent in a mode show '-')."""
    names = list(dict.fromkeys(n for n, _, _ in EPD_STAGES + EPD_EARLY_STAGES)) + ["worker ttft", "router + client",
                                                                                 KV_AFTER_TOKEN]
    lines = [f"{'stage (p50 ms)':<18}{'EPD':>10}{'colocated':>12}"]
    for n in names:
        cell = lambda d: f"{d[n]:.2f}" if n in d else "-"  # noqa: E731
        lines.append(f"{n:<18}{cell(epd):>10}{cell(colocated):>12}")
    lines.append(f"{'requests with stamps':<18}{int(epd.get('n', 0)):>10}{int(colocated.get('n', 0)):>12}")
    return lines
