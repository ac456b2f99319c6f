"""Prometheus text, parsed and scraped: the one module `status`, the canaries, `rebalance`
and `bench` read ``/metrics`` pages with (the runtime, which never imports the control plane,
only writes them).

``parse`` keeps every series with its labels; ``summed`` adds the label sets of each metric;
``page`` and ``worker`` fetch one page; ``scrape`` fetches many for `bench`, where ``delta``
keeps what a run changed. Why deltas: workers' counters and histograms are cumulative since start (the canary, earlier
runs), so only the difference between two scrapes belongs to this run. Counters, histogram
``_sum``/``_count`` and ``_total`` series are differenced; buckets are dropped (the client has
exact per-request latencies). Works for the embedded workers (``epd_*``) and smg (``smg_*``).

A cluster with an API key serves its workers' ``/metrics`` only with ``Authorization: Bearer
KEY``: every reader passes the variable that holds the key (``api_key_env``, the cluster
state's; None for an open cluster) and ``fetch`` reads it at call time. No module-level key:
one process may read several clusters (tests, `bench` on a URL beside a recorded cluster).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

from epdctl.probes import HttpReply, http

log = logging.getLogger(__name__)


def fetch(url: str, *, api_key_env: str | None, timeout: float = 5.0) -> HttpReply:
    """GET one metrics page (full URL), with the key held by ``api_key_env`` when it names one."""
    key = os.environ.get(api_key_env) if api_key_env else None
    return http("GET", url, timeout=timeout, headers={"Authorization": f"Bearer {key}"} if key else None)


_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


@dataclass(frozen=True)
class Endpoint:
    """One scrape target: a name for the report (worker name or "router") and its URL."""

    name: str
    role: str
    url: str  # full URL of the metrics page


def parse(text: str) -> dict[str, float]:
    """``name{labels}`` -> value for every sample line (comments and bad lines skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        try:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        except ValueError:
            continue
    return out


def summed(text: str) -> dict[str, float]:
    """Prometheus text -> {metric name: value summed over its label sets}."""
    out: dict[str, float] = {}
    for series, value in parse(text).items():
        name = series.split("{", 1)[0]
        out[name] = out.get(name, 0.0) + value
    return out


def page(url: str, *, api_key_env: str | None, timeout: float = 3.0) -> dict[str, float] | None:
    """One metrics page (full URL), parsed; None when it does not answer."""
    r = fetch(url, api_key_env=api_key_env, timeout=timeout)
    return parse(r.body.decode(errors="replace")) if r.ok else None


def worker(url: str, *, api_key_env: str | None, timeout: float = 5.0) -> dict[str, float]:
    """A worker's ``/metrics`` summed by metric name (empty when it serves none)."""
    r = fetch(url.rstrip("/") + "/metrics", api_key_env=api_key_env, timeout=timeout)
    return summed(r.body.decode(errors="replace")) if r.ok else {}


def _cumulative(series: str) -> bool:
    name = series.split("{", 1)[0]
    return name.endswith(("_total", "_sum", "_count")) and not name.endswith("_bucket")


def scrape(endpoints: list[Endpoint], *, api_key_env: str | None) -> dict[str, dict[str, float]]:
    """Current samples per endpoint; an endpoint that does not answer is left out (logged)."""
    out: dict[str, dict[str, float]] = {}
    for ep in endpoints:
        r = fetch(ep.url, api_key_env=api_key_env)
        if not r.ok:
            log.info("metrics %s (%s) not scraped: HTTP %s %s", ep.name, ep.url, r.status, r.error)
            continue
        out[ep.name] = parse(r.body.decode(errors="replace"))
    return out


def delta(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
          ) -> dict[str, dict[str, float]]:
    """Per endpoint, the cumulative series that changed between the two scrapes."""
    out: dict[str, dict[str, float]] = {}
    for name, now in after.items():
        prev = before.get(name, {})
        changed = {k: round(v - prev.get(k, 0.0), 6) for k, v in now.items()
                   if _cumulative(k) and v != prev.get(k, 0.0)}
        if changed:
            out[name] = dict(sorted(changed.items()))
    return out


def stage_means(d: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Mean seconds per histogram (and per label set) from ``_sum``/``_count`` deltas."""
    out: dict[str, dict[str, float]] = {}
    for name, series in d.items():
        means: dict[str, float] = {}
        for k, v in series.items():
            base, _, labels = k.partition("{")
            if not base.endswith("_sum"):
                continue
            cnt = series.get(base[:-4] + "_count" + ("{" + labels if labels else ""))
            if cnt:
                means[base[:-4] + ("{" + labels if labels else "")] = round(v / cnt, 6)
        if means:
            out[name] = means
    return out
