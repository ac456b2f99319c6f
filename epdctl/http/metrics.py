"""Prometheus text, parsed and scraped: the one module `status`, the canaries, `rebalance`
and `bench` read ``/metrics`` pages with (the runtime, which never imports the control plane,
only writes them).

``parse`` keeps every series with its labels (read with prometheus_client's text parser; a
series is keyed ``name{label="value",...}`` and ``labels`` reads such a key back with the same
parser); ``summed`` adds the label sets of each metric;
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

import functools
import logging
import os
from dataclasses import dataclass
from typing import Iterator

from prometheus_client.parser import text_string_to_metric_families

from epdctl.http.probes import HttpReply, http

log = logging.getLogger(__name__)


def fetch(url: str, *, api_key_env: str | None, timeout: float = 5.0) -> HttpReply:
    """GET one metrics page (full URL), with the key held by ``api_key_env`` when it names one."""
    key = os.environ.get(api_key_env) if api_key_env else None
    return http("GET", url, timeout=timeout, headers={"Authorization": f"Bearer {key}"} if key else None)


@dataclass(frozen=True)
class Endpoint:
    """One scrape target: a name for the report (worker name or "router") and its URL."""

    name: str
    role: str
    url: str  # full URL of the metrics page


def _samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            yield sample.name, sample.labels, float(sample.value)


def _read(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a page; when the page has a line the parser refuses, every line it accepts
    (one bad line does not hide the rest of the page)."""
    try:
        return list(_samples(text))
    except (ValueError, IndexError, TypeError):
        out: list[tuple[str, dict[str, str], float]] = []
        for line in text.splitlines():
            if line.strip() and not line.startswith("#"):
                try:
                    out.extend(_samples(line + "\n"))
                except (ValueError, IndexError, TypeError):
                    continue
        return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def series(name: str, labels: dict[str, str]) -> str:
    """The key of one series: ``name`` or ``name{a="1",b="2"}`` (labels in page order)."""
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def parse(text: str) -> dict[str, float]:
    """``name{labels}`` -> value for every sample (comments and lines that are not samples skipped)."""
    return {series(name, labels): value for name, labels, value in _read(text)}


@functools.lru_cache(maxsize=8192)
def _labels(key: str) -> tuple[tuple[str, str], ...]:
    got = _read(key + " 0\n")
    return tuple(got[0][1].items()) if got else ()


def labels(key: str) -> dict[str, str]:
    """The labels of a series key from ``parse`` (empty when it has none)."""
    return dict(_labels(key))


def name_of(key: str) -> str:
    """The metric name of a series key from ``parse``."""
    return key.split("{", 1)[0]


def summed(text: str) -> dict[str, float]:
    """Prometheus text -> {metric name: value summed over its label sets}."""
    out: dict[str, float] = {}
    for key, value in parse(text).items():
        name = name_of(key)
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


def _cumulative(key: str) -> bool:
    name = name_of(key)
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
    for name, by_series in d.items():
        means: dict[str, float] = {}
        for k, v in by_series.items():
            base, lab = name_of(k), labels(k)
            if not base.endswith("_sum"):
                continue
            cnt = by_series.get(series(base[:-4] + "_count", lab))
            if cnt:
                means[series(base[:-4], lab)] = round(v / cnt, 6)
        if means:
            out[name] = means
    return out
