"""Measure one worker's capacity per role on a running cluster (input of the planner).

Everything goes through the router as real requests, because that is the only interface every
deployment has; the per-role split comes from the decode's per-response ``timings`` and the
workers' own counters:

* **encoder** images/s = embedding-cache misses / vision-tower seconds, summed over the
  encoders (``epd_encoder_cache_misses_total``, ``epd_encoder_vision_seconds_total``), while
  requests carrying only new images are sent (distinct seed, no repeats).
* **prefill** tokens/s and fixed cost: a least-squares line through (prompt tokens,
  ``timings.prefill_ms``) of one-at-a-time requests with 1 and 4 images; tokens per image is
  the slope of ``usage.prompt_tokens`` over the image count.
* **decode** tokens/s at batch 1/4/16 per decode worker: closed loops with batch x
  (decode workers) requests in flight; tokens/s = batch / median client-side TPOT.
* **CPU cost** per role (for workers that share a host's cores): each worker's
  ``process_cpu_seconds_total`` delta per uncached image (encoders), per request (prefills)
  and per output token at each batch size (decodes). Everything a role does counts: HTTP,
  image decoding, transfers, not just the model.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any, Callable

from epdctl.http import metrics
from epdctl.bench import client
from epdctl.bench.target import Resolved
from epdctl.bench.workload import Workload
from epdctl.errors import EpdctlError

PROFILE_VERSION = 1
Say = Callable[[str], None]


def _sum_series(d: dict[str, dict[str, float]], name: str) -> float:
    return sum(v for series in d.values() for k, v in series.items() if k.split("{")[0] == name)


def _role_cpu(d: dict[str, dict[str, float]], resolved: Resolved) -> dict[str, float]:
    """CPU seconds per role in a scrape delta (process_cpu_seconds_total of each worker)."""
    roles = {e.name: e.role for e in resolved.endpoints}
    out: dict[str, float] = {}
    for name, series in d.items():
        v = series.get("process_cpu_seconds_total")
        if v is not None and name in roles:
            out[roles[name]] = out.get(roles[name], 0.0) + v
    return out


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x; (a, b). Falls back to a line through the origin."""
    if len(set(xs)) < 2:
        return 0.0, (sum(ys) / sum(xs)) if sum(xs) else 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def _run(resolved: Resolved, w: Workload) -> list[client.Sample]:
    samples, _ = client.run(resolved.target, w)
    bad = [s for s in samples if not s.ok]
    if bad:
        raise EpdctlError(f"profile: {len(bad)} of {len(samples)} requests failed "
                          f"({bad[0].error}); check `epdctl status`")
    return samples


def measure(resolved: Resolved, *, batches: tuple[int, ...] = (1, 4, 16), requests: int = 4,
            output_tokens: int = 32, seed: int | None = None, say: Say = lambda _: None) -> dict[str, Any]:
    """Run the three probes; returns the profile document (see ``planner.Profile``). A fresh
    seed by default: images the encoders cached in an earlier profile would measure the cache."""
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 30)
    state = resolved.state
    n_dec = max(1, sum(1 for p in state.workers if p.role == "decode" and p.is_leader)) if state else 1
    n_enc = sum(1 for p in state.workers if p.role == "encoder") if state else 0
    base = Workload(name="profile", repeat=0.0, plain=False, max_tokens=output_tokens,
                    concurrency=1, seed=seed)

    say("encoder + prefill: one request at a time, 1 and 4 new images")
    before = metrics.scrape(resolved.endpoints, api_key_env=resolved.api_key_env)
    one = _run(resolved, base.with_(images={1: 1.0}, requests=requests, seed=seed))
    four = _run(resolved, base.with_(images={4: 1.0}, requests=requests, seed=seed + 1))
    d = metrics.delta(before, metrics.scrape(resolved.endpoints, api_key_env=resolved.api_key_env))
    samples = one + four
    if not all(s.timings.get("prefill_ms") for s in samples):
        raise EpdctlError("profile needs the per-response `timings` object of epdctl's embedded "
                          "engine (prefill_ms, encode_ms); this endpoint does not send it")
    misses = _sum_series(d, "epd_encoder_cache_misses_total")
    vision_s = _sum_series(d, "epd_encoder_vision_seconds_total")
    if misses and vision_s:
        img_per_s = misses / vision_s
        enc_src = "encoder metrics: cache misses / vision seconds"
    else:  # no encoder metrics (colocated, or unreachable): per-request encode time
        img_s = [s.timings["encode_ms"] / 1000.0 / s.n_images for s in samples
                 if s.timings.get("encode_ms")]
        if not img_s:
            raise EpdctlError("profile: neither encoder metrics nor timings.encode_ms came back")
        img_per_s = 1.0 / statistics.median(img_s)
        enc_src = "timings.encode_ms per image"
    prompt = [float(s.prompt_tokens or 0) for s in samples]
    per_image = _fit([float(s.n_images) for s in samples], prompt)[1]
    overhead_ms, ms_per_token = _fit(prompt, [s.timings["prefill_ms"] for s in samples])
    if ms_per_token <= 0:
        overhead_ms, ms_per_token = 0.0, statistics.fmean(
            s.timings["prefill_ms"] / max(1.0, p) for s, p in zip(samples, prompt))
    kv_ms = statistics.median(s.timings.get("kv_transfer_ms", 0.0) for s in samples)
    cpu_ep = _role_cpu(d, resolved)
    cpu: dict[str, Any] = {}
    if cpu_ep.get("encoder") and misses:
        cpu["encoder_s_per_image"] = round(cpu_ep["encoder"] / misses, 6)
        if cpu["encoder_s_per_image"] > 1.0 / img_per_s:
            # the vision tower is not all an encoder does (HTTP, image decoding, transfers):
            # its whole process CPU per image is the honest capacity
            img_per_s = 1.0 / cpu["encoder_s_per_image"]
            enc_src = "encoder CPU seconds per uncached image (process_cpu_seconds_total)"
    if cpu_ep.get("prefill"):
        cpu["prefill_s_per_request"] = round(cpu_ep["prefill"] / len(samples), 6)
    cpu_tok: dict[str, float] = {}

    decode: dict[str, float] = {}
    tpot_ms: dict[str, float] = {}
    for b in batches:
        say(f"decode: batch {b} per decode worker ({b * n_dec} requests in flight)")
        c = b * n_dec
        before = metrics.scrape(resolved.endpoints, api_key_env=resolved.api_key_env)
        got = _run(resolved, base.with_(images={1: 1.0}, concurrency=c, requests=c * 2,
                                        repeat=0.5, seed=seed + 10 + b))
        dec_cpu = _role_cpu(metrics.delta(before, metrics.scrape(resolved.endpoints, api_key_env=resolved.api_key_env)),
                            resolved).get("decode")
        tokens = sum(s.completion_tokens or 0 for s in got)
        if dec_cpu and tokens:
            cpu_tok[str(b)] = round(dec_cpu / tokens, 6)
        tp = [s.tpot for s in got if s.tpot]
        if not tp:
            raise EpdctlError(f"profile: no request at batch {b} produced 2+ tokens; raise "
                              "--output-tokens")
        med = statistics.median(tp)
        decode[str(b)] = round(b / med, 3)
        tpot_ms[str(b)] = round(med * 1000.0, 3)
    return {
        "version": PROFILE_VERSION,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "target": resolved.target.base_url,
        "model": resolved.target.model,
        "seed": seed,
        "cluster": {"encoders": n_enc, "decodes": n_dec},
        "encoder": {"images_per_s": round(img_per_s, 3), "ms_per_image": round(1000 / img_per_s, 3),
                    "source": enc_src},
        "prefill": {"tokens_per_s": round(1000.0 / ms_per_token, 3),
                    "overhead_ms": round(max(0.0, overhead_ms), 3),
                    "tokens_per_image": round(per_image, 3),
                    "text_tokens": round(min(prompt) - per_image, 3)},
        "decode": {"tokens_per_s": decode, "tpot_ms": tpot_ms, "output_tokens": output_tokens},
        "kv_transfer_ms": round(kv_ms, 3),
        "cpu": {**cpu, **({"decode_s_per_token": cpu_tok} if cpu_tok else {}),
                "source": "workers' process_cpu_seconds_total"} if cpu or cpu_tok else {},
        "note": "per-worker rates measured on this cluster's machines; on a shared CPU host "
                "the roles compete for the same cores",
    }
