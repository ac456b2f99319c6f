"""Prometheus text exposition without extra dependencies.

Workers expose TTFT/TPOT histograms, queue depth, embedding-cache hits and bytes moved per
transport. prometheus_client would pull a dependency and a global registry into every
process; this is the small subset the workers need, with one registry per worker.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Callable, Iterable

LabelKey = tuple[tuple[str, str], ...]

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def _key(labels: dict[str, str] | None) -> LabelKey:
    return tuple(sorted((k, str(v)) for k, v in (labels or {}).items()))


def _fmt_labels(key: LabelKey, extra: tuple[tuple[str, str], ...] = ()) -> str:
    items = key + extra
    if not items:
        return ""
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in items)
    return "{" + body + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt_value(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


class _Metric:
    kind = "untyped"

    def __init__(self, name: str, help_text: str):
        self.name = name
        self.help = help_text
        self._lock = threading.Lock()

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        lines.extend(self._samples())
        return lines

    def _samples(self) -> list[str]:
        raise NotImplementedError


class Counter(_Metric):
    """Monotonic counter; labels are passed per call."""

    kind = "counter"

    def __init__(self, name: str, help_text: str):
        super().__init__(name, help_text)
        self._values: dict[LabelKey, float] = {}

    def inc(self, amount: float = 1.0, labels: dict[str, str] | None = None) -> None:
        key = _key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def get(self, labels: dict[str, str] | None = None) -> float:
        return self._values.get(_key(labels), 0.0)

    def _samples(self) -> list[str]:
        with self._lock:
            items = list(self._values.items()) or [((), 0.0)]
        return [f"{self.name}{_fmt_labels(k)} {_fmt_value(v)}" for k, v in items]


class Gauge(_Metric):
    """A value that is set, or read from a callback at scrape time (queue depth, cache size).

    With ``kind="counter"`` it exposes a monotonic total kept elsewhere (an engine's stats).
    """

    def __init__(self, name: str, help_text: str, fn: Callable[[], float] | None = None, kind: str = "gauge"):
        super().__init__(name, help_text)
        self.kind = kind
        self._values: dict[LabelKey, float] = {}
        self._fn = fn

    def set(self, value: float, labels: dict[str, str] | None = None) -> None:
        with self._lock:
            self._values[_key(labels)] = float(value)

    def _samples(self) -> list[str]:
        if self._fn is not None:
            return [f"{self.name} {_fmt_value(float(self._fn()))}"]
        with self._lock:
            items = list(self._values.items()) or [((), 0.0)]
        return [f"{self.name}{_fmt_labels(k)} {_fmt_value(v)}" for k, v in items]


class Histogram(_Metric):
    """Cumulative-bucket histogram (seconds by default)."""

    kind = "histogram"

    def __init__(self, name: str, help_text: str, buckets: Iterable[float] = LATENCY_BUCKETS):
        super().__init__(name, help_text)
        self.buckets = tuple(sorted(buckets))
        self._series: dict[LabelKey, list[float]] = {}

    def observe(self, value: float, labels: dict[str, str] | None = None) -> None:
        key = _key(labels)
        with self._lock:
            series = self._series.setdefault(key, [0.0] * (len(self.buckets) + 2))
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    series[i] += 1
            series[-2] += 1  # count
            series[-1] += value  # sum

    def count(self, labels: dict[str, str] | None = None) -> int:
        series = self._series.get(_key(labels))
        return int(series[-2]) if series else 0

    def _samples(self) -> list[str]:
        with self._lock:
            items = [(k, list(v)) for k, v in self._series.items()]
        if not items:
            items = [((), [0.0] * (len(self.buckets) + 2))]
        lines = []
        for key, series in items:
            for i, bound in enumerate(self.buckets):
                le = (("le", _fmt_value(bound)),)
                lines.append(f"{self.name}_bucket{_fmt_labels(key, le)} {_fmt_value(series[i])}")
            lines.append(f"{self.name}_bucket{_fmt_labels(key, (('le', '+Inf'),))} {_fmt_value(series[-2])}")
            lines.append(f"{self.name}_count{_fmt_labels(key)} {_fmt_value(series[-2])}")
            lines.append(f"{self.name}_sum{_fmt_labels(key)} {_fmt_value(series[-1])}")
        return lines


class Registry:
    """All metrics of one worker; ``render()`` is the body of ``GET /metrics``."""

    def __init__(self, prefix: str = "epd", process: bool = True):
        self.prefix = prefix
        self._metrics: dict[str, _Metric] = {}
        # Prometheus' standard name: CPU seconds of every thread of this worker (what a role
        # costs a host whose cores all workers share; read by `epdctl profile`).
        if process:
            self._add(Gauge("process_cpu_seconds_total", "Total user and system CPU time of this "
                            "worker process in seconds", time.process_time, kind="counter"))

    def _add(self, metric: _Metric) -> _Metric:
        return self._metrics.setdefault(metric.name, metric)

    def counter(self, name: str, help_text: str) -> Counter:
        return self._add(Counter(f"{self.prefix}_{name}", help_text))  # type: ignore[return-value]

    def gauge(self, name: str, help_text: str, fn: Callable[[], float] | None = None) -> Gauge:
        return self._add(Gauge(f"{self.prefix}_{name}", help_text, fn))  # type: ignore[return-value]

    def counter_fn(self, name: str, help_text: str, fn: Callable[[], float]) -> Gauge:
        """A counter whose total is read from ``fn`` at scrape time."""
        return self._add(Gauge(f"{self.prefix}_{name}", help_text, fn, kind="counter"))  # type: ignore[return-value]

    def histogram(self, name: str, help_text: str, buckets: Iterable[float] = LATENCY_BUCKETS) -> Histogram:
        return self._add(Histogram(f"{self.prefix}_{name}", help_text, buckets))  # type: ignore[return-value]

    def carry_over(self, old: "Registry") -> None:
        """Continue ``old``'s counters and histograms here (a switchable worker back in a role)."""
        for name, metric in self._metrics.items():
            prev = old._metrics.get(name)
            if isinstance(metric, Counter) and isinstance(prev, Counter):
                with prev._lock:
                    metric._values = dict(prev._values)
            elif isinstance(metric, Histogram) and isinstance(prev, Histogram) and prev.buckets == metric.buckets:
                with prev._lock:
                    metric._series = {k: list(v) for k, v in prev._series.items()}

    def render(self) -> str:
        lines: list[str] = []
        for metric in self._metrics.values():
            lines.extend(metric.render())
        return "\n".join(lines) + "\n"


def parse_text(text: str) -> dict[str, float]:
    """Parse exposition text into {"name{labels}": value}; used by tests and health tooling."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        out[name] = float(value.replace("+Inf", "inf"))
    return out
