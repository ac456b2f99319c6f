"""Post-launch canary: one real multi-image chat request through the router.

Why: a cluster whose processes are all "healthy" can still be unable to answer (a wrong
transport address, an encoder the prefill cannot reach). The canary sends generated shapes
(`epdctl.shapes`), checks the model's answer against what was drawn, and returns the per-stage
timings the decode worker adds to its response.
"""

from __future__ import annotations

import base64
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

from epdctl.errors import ProbeError
from epdctl.http.probes import http


@dataclass
class CanaryResult:
    """What the canary asked, what came back and whether it is right."""

    question: str
    expected: str
    answer: str
    correct: bool
    named: int                  # images the answer named correctly
    n_images: int
    seconds: float
    timings: dict[str, Any] = field(default_factory=dict)
    model: str = ""
    misses: list[Miss] = field(default_factory=list)


@dataclass
class Miss:
    """One image the answer got wrong: the item drawn, the item read (None: not named), and the
    other pictures of the request drawn as what was read."""

    picture: int
    want: Any                   # shapes.Item
    got: Any | None
    lent_by: list[int] = field(default_factory=list)

    @property
    def same_colour_copy(self) -> bool:
        """Another picture's item, of this picture's colour: the tiny model's known miss."""
        return self.got is not None and bool(self.lent_by) and self.got.colour == self.want.colour


def find_misses(items: list[Any], got: list[Any]) -> list[Miss]:
    """The wrong images of an answer (``items`` drawn, ``got`` read back by ``parse_answer``)."""
    return [Miss(k, want, read, [j for j, other in enumerate(items, start=1) if read is not None and other == read])
            for k, (want, read) in enumerate(zip(items, got), start=1) if read != want]


def data_url(png: bytes) -> str:
    """A PNG as an OpenAI-style data URL."""
    return "data:image/png;base64," + base64.b64encode(png).decode()


def build_messages(pngs: list[bytes], question: str) -> list[dict[str, Any]]:
    """One user message: the images in order, then the question."""
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": data_url(p)}}
                                   for p in pngs]
    parts.append({"type": "text", "text": question})
    return [{"role": "user", "content": parts}]


def model_id(router_url: str, headers: dict[str, str]) -> str:
    """The served model name, as the router lists it in `/v1/models`."""
    r = http("GET", router_url.rstrip("/") + "/v1/models", timeout=10.0, headers=headers)
    doc = r.json() if r.ok else None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not data:
        raise ProbeError(f"canary: router {router_url} lists no model in /v1/models "
                         f"(HTTP {r.status} {r.error}); are prefill/decode registered?")
    return str(data[0]["id"])


def run_canary(router_url: str, *, model: str | None = None, api_key_env: str | None = None,
               n_images: int = 3, seed: int | None = None, max_tokens: int = 48,
               timeout: float = 120.0, plain: bool = True, distinct_colours: bool = False) -> CanaryResult:
    """Send the request, parse the answer; ProbeError when no well-formed answer comes back.

    ``plain`` draws white-background centred shapes (the canary's default); ``False`` draws the
    varied ones (size, position, background) used to measure held-out accuracy.
    ``distinct_colours`` gives each of up to four images its own colour (`up`'s check of a new
    cluster: images read out of order show as wrong colours, and the tiny model's same-colour miss
    cannot occur); more images draw colours freely.
    """
    from epdctl import shapes  # PIL is imported only when a canary actually runs

    headers: dict[str, str] = {}
    key = os.environ.get(api_key_env) if api_key_env else None
    if key:
        headers["Authorization"] = f"Bearer {key}"
    model = model or model_id(router_url, headers)
    rng = random.Random(seed if seed is not None else time.time_ns())
    pngs, question, items = shapes.make_request(rng, n_images, plain=plain,
                                                distinct_colours=distinct_colours and n_images <= len(shapes.COLOURS))
    body = {"model": model, "messages": build_messages(pngs, question),
            "max_tokens": max_tokens, "temperature": 0.0, "stream": False}
    t0 = time.monotonic()
    r = http("POST", router_url.rstrip("/") + "/v1/chat/completions", body, timeout=timeout,
             headers=headers)
    seconds = time.monotonic() - t0
    doc = r.json()
    if not r.ok or not isinstance(doc, dict):
        detail = r.body[:500].decode(errors="replace") or r.error
        raise ProbeError(f"canary request to {router_url} failed (HTTP {r.status}): {detail}")
    try:
        answer = str(doc["choices"][0]["message"]["content"] or "")
    except (KeyError, IndexError, TypeError) as e:
        raise ProbeError(f"canary: malformed completion from {router_url} ({e}): "
                         f"{str(doc)[:300]}") from e
    got = shapes.parse_answer(answer, n_images)
    named = sum(1 for g, want in zip(got, items) if g == want)
    return CanaryResult(question=question, expected=shapes.answer_for(items), answer=answer,
                        correct=named == n_images, named=named, n_images=n_images,
                        seconds=seconds, timings=dict(doc.get("timings") or {}), model=model,
                        misses=find_misses(items, got))


@dataclass
class Accuracy:
    """Held-out accuracy over many canary requests of the same size."""

    n_images: int
    plain: bool
    requests: int
    named: int                  # images named correctly, over all requests
    correct_requests: int
    seconds: float

    @property
    def per_image(self) -> float:
        return self.named / (self.requests * self.n_images)

    @property
    def per_request(self) -> float:
        return self.correct_requests / self.requests


def measure_accuracy(router_url: str, *, n_images: int, requests: int, seed: int,
                     plain: bool = False, model: str | None = None,
                     api_key_env: str | None = None, parallel: int = 4) -> Accuracy:
    """Send ``requests`` fresh requests (seeds ``seed``..``seed+requests-1``) and score them.

    Why through the router: a correct answer proves embeddings crossed E->P and KV crossed P->D,
    so this is the model's accuracy as served, not in one process.
    """
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> CanaryResult:
        return run_canary(router_url, model=model, api_key_env=api_key_env, n_images=n_images,
                          seed=seed + i, plain=plain, max_tokens=12 * n_images + 8,
                          timeout=300.0)

    t0 = time.monotonic()
    with ThreadPoolExecutor(parallel) as pool:
        results = list(pool.map(one, range(requests)))
    return Accuracy(n_images=n_images, plain=plain, requests=requests,
                    named=sum(r.named for r in results),
                    correct_requests=sum(r.correct for r in results),
                    seconds=time.monotonic() - t0)
