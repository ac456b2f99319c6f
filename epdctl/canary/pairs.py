"""Per-pair canary: prove every encoder->prefill and prefill->decode pair really moves data.

Why per pair and from ``/metrics``: an HTTP 200 through the router proves one path works, not
that every pair does (the router keeps a prompt prefix on one decode; the prefills place images on
encoders by content hash). So each prefill x decode pair gets requests sent straight to it, as the
router would (one bootstrap room, ``rebalance.links.pd_pair``); the answer must name the drawn
shapes, which it can only do if the embeddings and the KV cache arrived; and the bytes are the
deltas of the workers' own ``epd_transport_bytes_{sent,received}_total`` counters around each
request. Encoder bytes are attributed to the prefill whose requests were in flight (requests are
sequential), and fresh random images are drawn until every encoder has sent to every prefill.
The embedded runtime returns small embeddings inline in the encoder's HTTP answer (counted apart,
``epd_*_inline_bytes_*_total``); the canary's requests ask for the transport
(``epd_force_transport``), so an E->P pair passes only on bytes its transport carried.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from epdctl.http import metrics
from epdctl.errors import ProbeError
from epdctl.rebalance.links import pd_pair

SENT, RECEIVED = "transport_bytes_sent_total", "transport_bytes_received_total"
INLINE_SENT, INLINE_RECEIVED = "inline_bytes_sent_total", "inline_bytes_received_total"


@dataclass
class PairResult:
    kind: str                   # "E->P" or "P->D"
    src: str
    dst: str
    sent: float = 0.0           # bytes the source's counter grew by
    received: float = 0.0       # bytes the destination's counter grew by (P->D; E->P: share)
    requests: int = 0
    correct: int = 0            # requests whose answer named every drawn shape
    error: str | None = None    # the pair could not be measured at all
    last_error: str | None = None  # the last failed request (HTTP error, answer naming nothing)

    @property
    def label(self) -> str:
        return f"{self.src}->{self.dst}"

    @property
    def ok(self) -> bool:
        if self.error is not None or self.sent <= 0 or self.received <= 0:
            return False
        return self.kind == "E->P" or self.correct > 0

    @property
    def reason(self) -> str:
        if self.error:
            return self.error
        if self.sent <= 0:
            return f"{self.src} sent no bytes over its transport"
        if self.received <= 0:
            return f"{self.dst} received no bytes over its transport"
        if not self.ok:
            why = f" (last: {self.last_error})" if self.last_error else ""
            return f"no answer named the drawn shapes in {self.requests} request(s){why}"
        return ""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "pair": self.label, "ok": self.ok, "reason": self.reason or None}


@dataclass
class PairReport:
    pairs: list[PairResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.pairs) and all(p.ok for p in self.pairs)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "pairs": [p.to_json() for p in self.pairs]}


def counters(url: str, api_key_env: str | None) -> tuple[float, ...] | None:
    """(sent, received) transport bytes of one worker, then (sent, received) inline bytes; None
    when its /metrics is unreachable."""
    r = metrics.fetch(url.rstrip("/") + "/metrics", api_key_env=api_key_env)
    if not r.ok:
        return None
    m = metrics.summed(r.body.decode(errors="replace"))
    return tuple(sum(v for k, v in m.items() if k.endswith(name))
                 for name in (SENT, RECEIVED, INLINE_SENT, INLINE_RECEIVED))


def _snapshot(workers: Sequence[Any], key_env: str | None) -> dict[str, tuple[float, ...] | None]:
    return {w.name: counters(w.url, key_env) for w in workers}


def _delta(a: dict[str, Any], b: dict[str, Any], name: str, i: int) -> float:
    if a.get(name) is None or b.get(name) is None:
        return 0.0
    return b[name][i] - a[name][i]


def _one(prefill: Any, decode: Any, model: str | None, seed: int, timeout: float) -> bool:
    """One request on exactly this pair; True when the answer names every drawn shape (the
    request is rebuilt from ``seed`` exactly as ``pd_pair`` draws it)."""
    from epdctl import shapes

    text = pd_pair(prefill, decode, model, seed=seed, timeout=timeout, force_transport=True)["answer"]
    items = shapes.make_request(random.Random(seed), 3, plain=True)[2]
    return shapes.parse_answer(text, 3) == items


def run_pair_canary(workers: Sequence[Any], *, model: str | None, api_key_env: str | None,
                    attempts: int = 4,
                    timeout: float = 120.0,
                    on_pair: Callable[[PairResult], None] | None = None) -> PairReport:
    """Every P->D pair (up to ``attempts`` requests until one answer is right) and every E->P
    pair (fresh images on that prefill until each encoder sent to it, at most ``attempts``
    more requests). ``workers``: records with name, role, url, host, bootstrap_port."""
    lead = [w for w in workers if getattr(w, "is_leader", True)]
    encs = [w for w in lead if w.role == "encoder"]
    pres = [w for w in lead if w.role == "prefill"]
    decs = [w for w in lead if w.role == "decode"]
    if not pres or not decs:
        raise ProbeError("pair canary: the cluster has no prefill/decode pair "
                         f"({len(pres)} prefill, {len(decs)} decode)")
    rng = random.Random(time.time_ns())
    report = PairReport()
    for p in pres:
        ep = {e.name: PairResult("E->P", e.name, p.name) for e in encs}
        for d in decs:
            pd = PairResult("P->D", p.name, d.name)
            while pd.requests < attempts and not (pd.correct and pd.sent > 0):
                _measured(p, d, encs, pd, ep, model, rng, timeout, api_key_env)
            report.pairs.append(pd)
            if on_pair:
                on_pair(pd)
        extra = 0
        while encs and extra < attempts and not all(r.sent > 0 for r in ep.values()):
            pd = PairResult("P->D", p.name, decs[0].name)
            _measured(p, decs[0], encs, pd, ep, model, rng, timeout, api_key_env)
            extra += 1
        for e in encs:
            r = ep[e.name]
            if counters(e.url, api_key_env) is None:
                r.error = f"{e.name}: /metrics at {e.url} unreachable (worker down?)"
            report.pairs.append(r)
            if on_pair:
                on_pair(r)
    return report


def _measured(p: Any, d: Any, encs: Sequence[Any], pd: PairResult,
              ep: dict[str, PairResult], model: str | None, rng: random.Random,
              timeout: float, key_env: str | None) -> None:
    """One request on (p, d) with every involved counter read before and after."""
    watched = [p, d, *encs]
    before = _snapshot(watched, key_env)
    pd.requests += 1
    try:
        pd.correct += _one(p, d, model, rng.getrandbits(48), timeout)
    except ProbeError as e:  # a wrong or failed answer; the pair's verdict says which
        pd.last_error = str(e)
    after = _snapshot(watched, key_env)
    pd.sent += _delta(before, after, p.name, 0)
    pd.received += _delta(before, after, d.name, 1)
    got = _delta(before, after, p.name, 1)
    senders = {e.name: _delta(before, after, e.name, 0) for e in encs}
    total = sum(senders.values())
    for name, sent in senders.items():
        r = ep[name]
        r.sent += sent
        r.requests += 1
        if total > 0:
            r.received += got * sent / total   # the prefill's received bytes, by share


def byte_deltas(workers: Sequence[Any], action: Callable[[], Any], *,
                api_key_env: str | None) -> tuple[Any, dict[str, Any]]:
    """Run ``action`` and return its result with each worker's byte deltas over it: (sent,
    received, of which inline sent, of which inline received) — transport and inline together,
    since requests through the router take whichever path their size picks — or None for a
    worker whose /metrics could not be read."""
    lead = [w for w in workers if getattr(w, "is_leader", True)]
    before = _snapshot(lead, api_key_env)
    result = action()
    after = _snapshot(lead, api_key_env)
    out: dict[str, Any] = {}
    for w in lead:
        if before[w.name] is None or after[w.name] is None:
            out[w.name] = None
            continue
        d = [_delta(before, after, w.name, i) for i in range(4)]
        out[w.name] = (d[0] + d[2], d[1] + d[3], d[2], d[3])
    return result, out
