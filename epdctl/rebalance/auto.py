"""`epdctl rebalance --auto`: a policy that moves one worker at a time toward the bottleneck.

``decide`` is pure (sample + previous state -> proposal + next state) so it is tested with
synthetic metric sequences. It never flaps: a role must look short (per-worker queue above
``high``, or TTFT/TPOT over target) and another idle (below ``low``) for ``sustain`` samples in a
row with the *same* pair, and after a move nothing happens for ``cooldown`` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from epdctl.probes import get_loads
from epdctl import metrics

ROLES = ("encoder", "prefill", "decode")


@dataclass(frozen=True)
class Sample:
    """One look at the cluster."""

    t: float
    counts: dict[str, int]
    queue: dict[str, float]               # queued + running work per role, summed over workers
    ttft: float | None = None             # seconds, mean since the previous sample
    tpot: float | None = None


@dataclass(frozen=True)
class Policy:
    high: float = 4.0                     # per-worker queue above which a role is short
    low: float = 0.5                      # per-worker queue at or below which a role can give one
    ttft_target: float | None = None
    tpot_target: float | None = None
    sustain: int = 3                      # consecutive agreeing samples before acting
    cooldown: float = 60.0                # seconds after a move with no new move


@dataclass(frozen=True)
class Proposal:
    target: str
    source: str
    reason: str


@dataclass(frozen=True)
class AutoState:
    candidate: tuple[str, str] | None = None
    streak: int = 0
    last_move: float | None = None
    log: tuple[str, ...] = field(default=(), compare=False)


def pressure(policy: Policy, s: Sample) -> dict[str, float]:
    """Per role: per-worker queue / ``high`` (>= 1 means short), raised by missed targets."""
    p = {r: (s.queue.get(r, 0.0) / max(1, s.counts.get(r, 0))) / policy.high
         for r in ROLES if s.counts.get(r, 0) > 0}
    if policy.ttft_target and s.ttft is not None:
        front = max((r for r in ("encoder", "prefill") if r in p), key=lambda r: p[r],
                    default=None)
        if front is not None:
            p[front] = max(p[front], s.ttft / policy.ttft_target)
    if policy.tpot_target and s.tpot is not None and "decode" in p:
        p["decode"] = max(p["decode"], s.tpot / policy.tpot_target)
    return p


def candidate(policy: Policy, s: Sample) -> tuple[tuple[str, str] | None, str]:
    """The (target, source) pair this sample asks for, with the reason."""
    p = pressure(policy, s)
    short = [r for r in p if p[r] >= 1.0]
    if not short:
        return None, "no role is short"
    target = max(short, key=lambda r: p[r])
    idle_ratio = policy.low / policy.high
    donors = [r for r in p if r != target and s.counts.get(r, 0) > 1 and p[r] <= idle_ratio]
    if not donors:
        return None, f"{target} is short but no other role has a spare idle worker"
    source = min(donors, key=lambda r: p[r])
    return (target, source), (f"{target} pressure {p[target]:.2f} >= 1, {source} "
                              f"{p[source]:.2f} <= {idle_ratio:.2f}")


def decide(policy: Policy, st: AutoState, s: Sample) -> tuple[Proposal | None, AutoState]:
    """One policy step: a proposal when the same move was wanted ``sustain`` times, off cool-down."""
    pair, reason = candidate(policy, s)
    if pair is None:
        return None, replace(st, candidate=None, streak=0)
    streak = st.streak + 1 if pair == st.candidate else 1
    st = replace(st, candidate=pair, streak=streak)
    if st.last_move is not None and s.t - st.last_move < policy.cooldown:
        return None, st
    if streak < policy.sustain:
        return None, st
    return Proposal(pair[0], pair[1], reason), replace(st, candidate=None, streak=0,
                                                      last_move=s.t)


class Collector:
    """Reads the live metrics a Sample needs (worker `/v1/loads`, encoder and router metrics)."""

    def __init__(self, prometheus_url: str | None):
        self.prometheus_url = prometheus_url
        self._ttft: tuple[float, float] | None = None

    def sample(self, t: float, workers: list[Any]) -> Sample:
        counts = {r: 0 for r in ROLES}
        queue = {r: 0.0 for r in ROLES}
        for w in workers:
            if w.role not in counts or not getattr(w, "is_leader", True):
                continue
            counts[w.role] += 1
            if w.role == "encoder":
                m = metrics.worker(w.url)
                queue["encoder"] += sum(v for k, v in m.items() if k.endswith("queue_depth"))
            else:
                load = get_loads(w.url)
                if load is not None:
                    queue[w.role] += load.running + load.waiting
        return Sample(t=t, counts=counts, queue=queue, ttft=self._ttft_mean())

    def _ttft_mean(self) -> float | None:
        if not self.prometheus_url:
            return None
        r = metrics.fetch(self.prometheus_url.rstrip("/") + "/metrics", timeout=3.0)
        if not r.ok:
            return None
        m = metrics.summed(r.body.decode(errors="replace"))
        cur = (m.get("smg_pd_ttft_seconds_sum", 0.0), m.get("smg_pd_ttft_seconds_count", 0.0))
        prev, self._ttft = self._ttft, cur
        if prev is None or cur[1] <= prev[1]:
            return None
        return (cur[0] - prev[0]) / (cur[1] - prev[1])
