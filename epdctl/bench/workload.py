"""A benchmark workload: what requests look like and how fast they arrive.

One description serves two readers: the load generator (``client.py``) draws concrete requests
from it, deterministically from a seed so two runs (EPD vs colocated) send the same bytes, and
the planner (``planner.py``) reads the same fields as averages (images per request, repeated
share, token lengths, request rate, optionally per hour of day).

YAML form (every key optional except one of rate/concurrency when benchmarking)::

    name: mixed-4-8
    images: 4-8              # fixed (4), a range (4-8, uniform) or {2: 0.5, 8: 0.5}
    repeat: 0.3              # share of images that repeat one sent earlier
    plain: false             # plain (white, centred) shapes or varied ones
    prompt_tokens: 12        # text tokens besides the images (planner; the prompt is fixed)
    max_tokens: 32           # output length asked for
    rate: 0.5                # Poisson arrivals, requests/s ...
    concurrency: 2           # ... or a closed loop with this many requests in flight
    duration: 30             # seconds to send for ...
    requests: 20             # ... or this many requests (first limit reached wins)
    seed: 0
    hours: {9: 0.5, 12: 2.0} # planner only: request rate by hour of day
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from epdctl.errors import EpdctlError


class WorkloadError(EpdctlError):
    """A workload description is malformed."""


_KEYS = {"name", "images", "repeat", "plain", "prompt_tokens", "max_tokens", "ignore_eos", "rate",
         "concurrency", "duration", "requests", "seed", "hours", "timeout"}


@dataclass(frozen=True)
class Workload:
    """Request shape and arrival process; see the module docstring for the YAML form."""

    name: str = "workload"
    images: dict[int, float] = field(default_factory=lambda: {4: 1.0})
    repeat: float = 0.0
    plain: bool = False
    prompt_tokens: int = 12
    max_tokens: int = 32
    ignore_eos: bool = False    # every answer runs to max_tokens (decode-bound benchmarks)
    rate: float | None = None
    concurrency: int | None = None
    duration: float | None = None
    requests: int | None = None
    seed: int = 0
    hours: dict[int, float] = field(default_factory=dict)
    timeout: float = 600.0

    @property
    def mean_images(self) -> float:
        return sum(n * p for n, p in self.images.items())

    def with_(self, **changes: Any) -> "Workload":
        """A copy with some fields replaced (CLI overrides), validated again."""
        w = replace(self, **{k: v for k, v in changes.items() if v is not None})
        validate(w)
        return w

    def describe(self) -> str:
        imgs = ", ".join(f"{n}:{p:.2f}" for n, p in sorted(self.images.items()))
        load = (f"rate {self.rate:g}/s (Poisson)" if self.rate is not None
                else f"concurrency {self.concurrency}" if self.concurrency is not None
                else "hourly rates only")
        stop = " or ".join(x for x in (f"{self.requests} requests" if self.requests else "",
                                       f"{self.duration:g}s" if self.duration else "") if x)
        return (f"{self.name}: images {{{imgs}}}, repeat {self.repeat:.0%}, max_tokens "
                f"{self.max_tokens}{' (ignore_eos)' if self.ignore_eos else ''}, {load}, "
                f"{stop or 'unbounded'}, seed {self.seed}")


def parse_images(value: Any, where: str = "images") -> dict[int, float]:
    """``4`` | ``"4-8"`` | ``{2: 0.5, 8: 0.5}`` -> normalised {count: probability}."""
    if isinstance(value, bool):
        raise WorkloadError(f"{where}: expected a count, a range like 4-8 or a mapping, got {value!r}")
    if isinstance(value, int):
        dist = {value: 1.0}
    elif isinstance(value, str):
        text = value.strip()
        try:
            if "-" in text:
                lo, hi = (int(x) for x in text.split("-", 1))
                if lo > hi:
                    raise ValueError
                dist = {n: 1.0 for n in range(lo, hi + 1)}
            else:
                dist = {int(text): 1.0}
        except ValueError:
            raise WorkloadError(f"{where}: {value!r} is not a count or a range like 4-8") from None
    elif isinstance(value, dict) and value:
        try:
            dist = {int(k): float(v) for k, v in value.items()}
        except (TypeError, ValueError):
            raise WorkloadError(f"{where}: mapping must be count: weight, got {value!r}") from None
    else:
        raise WorkloadError(f"{where}: expected a count, a range like 4-8 or a mapping, got {value!r}")
    if any(n < 1 or n > 64 for n in dist) or any(p < 0 for p in dist.values()):
        raise WorkloadError(f"{where}: counts must be 1-64 and weights >= 0, got {value!r}")
    total = sum(dist.values())
    if total <= 0:
        raise WorkloadError(f"{where}: weights sum to 0")
    return {n: p / total for n, p in sorted(dist.items()) if p > 0}


def validate(w: Workload) -> None:
    """Raise WorkloadError naming the first field that is out of range."""
    if not 0.0 <= w.repeat < 1.0:
        raise WorkloadError(f"repeat: must be in [0, 1), got {w.repeat}")
    if w.rate is not None and w.rate <= 0:
        raise WorkloadError(f"rate: must be > 0 requests/s, got {w.rate}")
    if w.concurrency is not None and w.concurrency < 1:
        raise WorkloadError(f"concurrency: must be >= 1, got {w.concurrency}")
    if w.max_tokens < 1 or w.prompt_tokens < 0:
        raise WorkloadError("max_tokens must be >= 1 and prompt_tokens >= 0")
    if w.duration is not None and w.duration <= 0:
        raise WorkloadError(f"duration: must be > 0 seconds, got {w.duration}")
    if w.requests is not None and w.requests < 1:
        raise WorkloadError(f"requests: must be >= 1, got {w.requests}")
    for h, r in w.hours.items():
        if not 0 <= h <= 23 or r < 0:
            raise WorkloadError(f"hours: {h}: {r} must be hour 0-23 with a rate >= 0")


def from_dict(doc: Any, source: str = "workload") -> Workload:
    """Build a Workload from a parsed YAML mapping."""
    if not isinstance(doc, dict):
        raise WorkloadError(f"{source}: top level must be a mapping of workload settings")
    unknown = sorted(set(map(str, doc)) - _KEYS)
    if unknown:
        raise WorkloadError(f"{source}: unknown key(s) {', '.join(unknown)}; valid keys: "
                            f"{', '.join(sorted(_KEYS))}")
    kw: dict[str, Any] = {}
    try:
        if "images" in doc:
            kw["images"] = parse_images(doc["images"], f"{source}: images")
        for k, conv in (("name", str), ("repeat", float), ("plain", bool), ("prompt_tokens", int),
                        ("max_tokens", int), ("ignore_eos", bool), ("rate", float),
                        ("concurrency", int),
                        ("duration", float), ("requests", int), ("seed", int), ("timeout", float)):
            if doc.get(k) is not None:
                kw[k] = conv(doc[k])
        if doc.get("hours"):
            if not isinstance(doc["hours"], dict):
                raise WorkloadError(f"{source}: hours must map hour (0-23) to requests/s")
            kw["hours"] = {int(h): float(r) for h, r in doc["hours"].items()}
    except (TypeError, ValueError) as e:
        raise WorkloadError(f"{source}: bad value ({e})") from None
    w = Workload(**kw)
    try:
        validate(w)
    except WorkloadError as e:
        raise WorkloadError(f"{source}: {e}") from None
    return w


def load_workload(path: Path) -> Workload:
    """Read a workload YAML file; WorkloadError with the path on any problem."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise WorkloadError(f"cannot read workload {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise WorkloadError(f"workload {path} is not valid YAML: {e}") from None
    return from_dict(doc, str(path))


@dataclass(frozen=True)
class Request:
    """One concrete request: PNG images (in order), the question and the expected answer."""

    index: int
    pngs: tuple[bytes, ...]
    question: str
    expected: str
    repeated: int  # how many of the images were repeats of earlier ones


class RequestSource:
    """Draws requests from a workload, reproducibly: the i-th request depends only on the seed.

    Repeated images are taken from a pool of images already sent, so a repeat really hits the
    encoders' embedding cache (same bytes, same content hash).
    """

    def __init__(self, workload: Workload):
        self.w = workload
        self.rng = random.Random(workload.seed)
        self.arrivals = random.Random(f"{workload.seed}-arrivals")  # same requests at any rate
        self.seen: list[tuple[bytes, Any]] = []
        self.count = 0

    def _n_images(self) -> int:
        r, acc = self.rng.random(), 0.0
        for n, p in self.w.images.items():
            acc += p
            if r < acc:
                return n
        return max(self.w.images)

    def next(self) -> Request:
        from epdctl import shapes  # PIL only when requests are really drawn

        pngs, items, repeated = [], [], 0
        for _ in range(self._n_images()):
            if self.seen and self.rng.random() < self.w.repeat:
                png, item = self.rng.choice(self.seen)
                repeated += 1
            else:
                img, item = shapes.random_item(self.rng, plain=self.w.plain)
                png = shapes.to_png(img)
                self.seen.append((png, item))
            pngs.append(png)
            items.append(item)
        req = Request(self.count, tuple(pngs), shapes.question(), shapes.answer_for(items),
                      repeated)
        self.count += 1
        return req

    def interarrival(self) -> float:
        """Seconds to the next arrival (exponential: a Poisson process at ``rate``)."""
        return self.arrivals.expovariate(self.w.rate) if self.w.rate else 0.0
