"""What `rebalance --auto` sees of a live cluster: one ``Sample`` per look.

Per role, the policy wants the role's OWN work, not queues that mix stages: on a prefill,
requests waiting for their embeddings count as running; on a decode, requests waiting for their
KV count as waiting, so under an encoder bottleneck ``/v1/loads`` makes the prefill and decode
look busy and the encoder (which has no ``/v1/loads``) invisible. Each worker's ``/metrics``
page is read for its role's busy seconds and own queue (``own_work.py``: the embedded runtime's
``epd_<role>_*`` series, SGLang's forward-time and scheduler-queue series); the collector turns
the busy counter into a utilisation (busy seconds per second, 0..1 per worker, mean over the
role) and uses the own queue. A worker that exports neither (vLLM; SGLang without
``--enable-metrics``) falls back to ``/v1/loads`` running + waiting (encoders: their
``queue_depth``) and gives no utilisation. The ``/v1/loads`` view is kept in the sample (logged).
"""

from __future__ import annotations

from typing import Any

from epdctl.http import metrics
from epdctl.http.probes import get_loads
from epdctl.rebalance.auto import ROLES, Sample
from epdctl.rebalance.own_work import busy_seconds, own_queue


def _page(url: str, api_key_env: str | None) -> dict[str, float]:
    r = metrics.fetch(url.rstrip("/") + "/metrics", api_key_env=api_key_env, timeout=5.0)
    return metrics.parse(r.body.decode(errors="replace")) if r.ok else {}


def _loads(url: str) -> float:
    load = get_loads(url)
    return float(load.running + load.waiting) if load is not None else 0.0


class Collector:
    """Reads the live metrics a Sample needs (worker ``/metrics`` and ``/v1/loads``, router TTFT);
    ``api_key_env`` names the variable holding the cluster's key (None: an open cluster)."""

    def __init__(self, prometheus_url: str | None, window: float = 0.0, *, api_key_env: str | None):
        self.prometheus_url = prometheus_url
        self.api_key_env = api_key_env
        self.window = window  # seconds a utilisation is averaged over (0: since the last look)
        self._ttft: tuple[float, float] | None = None
        # (url, role) -> [(t, busy seconds counted from the first look, resets corrected)],
        # plus the counter's last raw value
        self._busy: dict[tuple[str, str], tuple[list[tuple[float, float]], float]] = {}

    def sample(self, t: float, workers: list[Any]) -> Sample:
        counts = {r: 0 for r in ROLES}
        queue = {r: 0.0 for r in ROLES}
        loads = {r: 0.0 for r in ROLES}  # the outside view (`/v1/loads`), logged for comparison
        utils: dict[str, list[float]] = {r: [] for r in ROLES}
        seen: set[tuple[str, str]] = set()
        for w in workers:
            if w.role not in counts or not getattr(w, "is_leader", True):
                continue
            counts[w.role] += 1
            page = _page(w.url, self.api_key_env)
            outside = (sum(v for k, v in page.items() if k.split("{", 1)[0].endswith("queue_depth")
                           and "_own_" not in k) if w.role == "encoder" else _loads(w.url))
            loads[w.role] += outside
            own = own_queue(page, w.role)
            queue[w.role] += own if own is not None else outside
            key = (w.url, w.role)
            seen.add(key)
            u = self._utilisation(key, t, busy_seconds(page, w.role))
            if u is not None:
                utils[w.role].append(u)
        self._busy = {k: v for k, v in self._busy.items() if k in seen}  # moved workers start over
        util = {r: sum(v) / len(v) for r, v in utils.items() if v}
        return Sample(t=t, counts=counts, queue=queue, ttft=self._ttft_mean(), util=util,
                      loads=loads)

    def _utilisation(self, key: tuple[str, str], t: float, busy: float | None) -> float | None:
        """Busy seconds per second over the last ``window`` seconds (at least since the previous
        look; None on the first look, or when the worker does not export busy time). A counter
        that went back (the role's servers were rebuilt by an in-place switch) counts from zero,
        as Prometheus' rate() does."""
        if busy is None:
            self._busy.pop(key, None)
            return None
        if key not in self._busy:
            self._busy[key] = ([(t, 0.0)], busy)
            return None
        points, raw = self._busy[key]
        if t <= points[-1][0]:
            return None
        points.append((t, points[-1][1] + (busy - raw if busy >= raw else busy)))
        while len(points) > 2 and points[1][0] <= t - self.window:
            points.pop(0)
        self._busy[key] = (points, busy)
        (t0, b0), (t1, b1) = points[0], points[-1]
        return max(0.0, min(1.0, (b1 - b0) / (t1 - t0)))

    def _ttft_mean(self) -> float | None:
        if not self.prometheus_url:
            return None
        r = metrics.fetch(self.prometheus_url.rstrip("/") + "/metrics", api_key_env=self.api_key_env,
                          timeout=3.0)
        if not r.ok:
            return None
        m = metrics.summed(r.body.decode(errors="replace"))
        cur = (m.get("smg_pd_ttft_seconds_sum", 0.0), m.get("smg_pd_ttft_seconds_count", 0.0))
        prev, self._ttft = self._ttft, cur
        if prev is None or cur[1] <= prev[1]:
            return None
        return (cur[0] - prev[0]) / (cur[1] - prev[1])
