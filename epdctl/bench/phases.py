"""A closed-loop load that changes shape over time: images-heavy for a while, then text-only.

`rebalance --auto` is judged on a load whose bottleneck moves; this sends it. Each client thread
sends one request after another through the router with the official ``openai`` client; the
phase in force when a request starts decides its shape:

- ``images``: ``images`` images per request, each with bytes never sent before (a picture from
  a small pool with a unique ``tEXt`` chunk: the client stays cheap, and every image costs the
  encoders a decode and a vision-tower pass, no embedding-cache hit) and a short answer;
- ``text``: no image, a longer answer (``ignore_eos``), so prefill and decode do the work.

Every request is recorded (start, end, phase, ok, error); ``summary`` gives p50/p99 per phase.
"""

from __future__ import annotations

import itertools
import random
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Phase:
    name: str            # "images" | "text"
    seconds: float
    images: int = 8
    max_tokens: int = 8


@dataclass
class Record:
    start: float
    end: float
    phase: str
    ok: bool
    error: str = ""


def unique_png(png: bytes, tag: int) -> bytes:
    """``png`` with a ``tEXt`` chunk naming ``tag`` before IEND: the same picture, new bytes, so
    the encoders' embedding cache (keyed by the bytes' digest) misses and the image is encoded."""
    if not png.endswith(b"IEND\xaeB`\x82"):
        raise ValueError("not a PNG ending in IEND")
    data = b"epdctl\x00" + str(tag).encode()
    chunk = (struct.pack(">I", len(data)) + b"tEXt" + data
             + struct.pack(">I", zlib.crc32(b"tEXt" + data) & 0xFFFFFFFF))
    return png[:-12] + chunk + png[-12:]


def _messages(rng: random.Random, phase: Phase, pool: list[bytes], tag: itertools.count
              ) -> list[dict[str, Any]]:
    from epdctl import shapes
    from epdctl.canary import build_messages

    if phase.name == "text":
        return [{"role": "user", "content": "Describe, in a few sentences, how a shape differs "
                 f"from a colour. Request {rng.randrange(1 << 30)}."}]
    pngs = [unique_png(rng.choice(pool), next(tag)) for _ in range(phase.images)]
    return build_messages(pngs, shapes.question())


@dataclass
class PhasedLoad:
    """``clients`` threads sending through ``router`` while the phases run, back to back."""

    router: str
    phases: list[Phase]
    clients: int = 2
    model: str = "tiny-qwen2vl"
    api_key: str = "none"
    records: list[Record] = field(default_factory=list)
    started: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def phase_at(self, t: float) -> Phase | None:
        """The phase in force at wall time ``t`` (None after the last one)."""
        edge = self.started
        for p in self.phases:
            edge += p.seconds
            if t < edge:
                return p
        return None

    def bounds(self) -> list[tuple[str, float, float]]:
        """(name, start, end) of every phase, wall time."""
        out, edge = [], self.started
        for p in self.phases:
            out.append((p.name, edge, edge + p.seconds))
            edge += p.seconds
        return out

    def start(self) -> None:
        self.started = time.time()
        for i in range(self.clients):
            t = threading.Thread(target=self._loop, args=(i,), daemon=True, name=f"load-{i}")
            t.start()
            self._threads.append(t)

    def join(self, timeout: float = 300.0) -> None:
        """Wait for the last phase to end (or ``stop``), then for the requests in flight."""
        for t in self._threads:
            t.join(timeout)

    def _loop(self, seed: int) -> None:
        from openai import OpenAI

        api = OpenAI(base_url=self.router.rstrip("/") + "/v1", api_key=self.api_key,
                     max_retries=0, timeout=300)
        from epdctl import shapes

        rng = random.Random(seed)
        pool = [shapes.to_png(shapes.random_item(rng)[0]) for _ in range(32)]
        tag = itertools.count(seed << 32)
        while not self.stop.is_set():
            t0 = time.time()
            phase = self.phase_at(t0)
            if phase is None:
                return
            try:
                r = api.chat.completions.create(
                    model=self.model, max_tokens=phase.max_tokens, temperature=0.0,
                    messages=_messages(rng, phase, pool, tag),  # type: ignore[arg-type]
                    extra_body={"ignore_eos": True} if phase.name == "text" else None)
                ok, err = bool(r.choices and r.choices[0].message.content is not None), ""
            except Exception as e:  # noqa: BLE001 - every failure is recorded and reported
                ok, err = False, repr(e)[:300]
            self.records.append(Record(t0, time.time(), phase.name, ok, err))

    def summary(self, since: float | None = None, until: float | None = None
                ) -> dict[str, Any]:
        """Requests, failures, p50/p99 latency of the requests started in [since, until)."""
        rows = [r for r in self.records if (since is None or r.start >= since)
                and (until is None or r.start < until)]
        lat = sorted(r.end - r.start for r in rows if r.ok)

        def pct(q: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(q * len(lat)))], 3) if lat else None

        return {"requests": len(rows), "failed": sum(not r.ok for r in rows),
                "p50_s": pct(0.5), "p99_s": pct(0.99)}
