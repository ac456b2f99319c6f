"""Which ``/metrics`` series measure a role's OWN work, per engine, read off one parsed page.

Busy seconds (a counter: its rate is the share of time the role's compute was occupied) and the
own queue (work waiting for that compute, not for another stage):

- embedded runtime: ``epd_<role>_busy_seconds_total`` and ``epd_<role>_own_queue_depth``
  (``epdctl/runtime/servers/busy.py``);
- SGLang 0.5.23 (names from ``sglang/srt/observability/metrics_collector.py``, served with
  ``--enable-metrics``): prefill/decode busy = ``sglang:forward_execution_seconds_total`` (GPU
  forward time, every ``category`` but ``idle``, the filler passes of data-parallel attention;
  exported only with ``SGLANG_ENABLE_METRICS_DEVICE_TIMER=1``),
  encoder busy = the sum of ``sglang:encoder_model_forward_seconds`` (one observation per ViT
  forward); own queue = ``sglang:num_queue_reqs`` (the scheduler's waiting queue: requests
  waiting for images sit in the multimodal receiver and KV transfers in their own queues), on a
  decode plus ``sglang:num_decode_prealloc_queue_reqs`` (waiting for KV memory). Its
  ``scheduler_idle_seconds_total`` is not used: a decode waiting for a KV transfer is not idle
  there, which is exactly the mixing of stages this avoids.

A page whose engine exports none of these gives None, and the collector falls back to
``/v1/loads``. SGLang pages carry one series per scheduler (``tp_rank``/``dp_rank``/...): values
are averaged over those, so a data-parallel worker reads as one worker.
"""

from __future__ import annotations

from epdctl.http.metrics import labels, name_of

ROLE_BUSY: dict[str, tuple[str, ...]] = {
    "encoder": ("epd_encoder_busy_seconds_total", "sglang:encoder_model_forward_seconds_sum"),
    "prefill": ("epd_prefill_busy_seconds_total", "sglang:forward_execution_seconds_total"),
    "decode": ("epd_decode_busy_seconds_total", "sglang:forward_execution_seconds_total"),
}
ROLE_QUEUE: dict[str, tuple[tuple[str, ...], ...]] = {
    "encoder": (("epd_encoder_own_queue_depth",),),
    "prefill": (("epd_prefill_own_queue_depth",), ("sglang:num_queue_reqs",)),
    "decode": (("epd_decode_own_queue_depth",),
               ("sglang:num_queue_reqs", "sglang:num_decode_prealloc_queue_reqs")),
}
_SPLIT = {"category", "modality", "le", "mode", "priority"}  # split one scheduler's series


def _per_scheduler(page: dict[str, float], name: str) -> float | None:
    """Sum of ``name``'s series per scheduler (label set without the splitting labels), averaged
    over schedulers; None when the page has no such series."""
    groups: dict[tuple[tuple[str, str], ...], float] = {}
    for series, value in page.items():
        found = labels(series)
        if name_of(series) != name or found.get("category") == "idle":  # DP-attention filler passes: no own work
            continue
        key = tuple(sorted((k, v) for k, v in found.items() if k not in _SPLIT))
        groups[key] = groups.get(key, 0.0) + value
    return sum(groups.values()) / len(groups) if groups else None


def busy_seconds(page: dict[str, float], role: str) -> float | None:
    """The role's busy-seconds counter on this page (the first engine family present)."""
    for name in ROLE_BUSY.get(role, ()):
        value = _per_scheduler(page, name)
        if value is not None:
            return value
    return None


def own_queue(page: dict[str, float], role: str) -> float | None:
    """Work queued for the role's own compute on this page (the first engine family present)."""
    for names in ROLE_QUEUE.get(role, ()):
        values = [_per_scheduler(page, n) for n in names]
        if any(v is not None for v in values):
            return sum(v for v in values if v is not None)
    return None
