"""`epdctl rebalance --auto`: a policy that moves one worker at a time toward the bottleneck.

``decide`` is pure (sample + previous state -> proposal + next state) so it is tested with
synthetic metric sequences. A role is short when its own work is high: per-worker queue at
``high`` or utilisation (busy seconds per second, `signals.py`) at ``busy_high``, or TTFT/TPOT
over target; it may give a worker when both are at or below ``low`` / ``busy_low``. It never
flaps: the same (short, giver) pair must be seen ``sustain`` samples in a row, after a move
nothing happens for ``cooldown`` seconds, and the role the last move grew gives a worker back only
when its others would carry all its work at or below ``low`` / ``busy_low`` (on shared cores the
workers a move added look idle while the load that asked for them goes on).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

ROLES = ("encoder", "prefill", "decode")


@dataclass(frozen=True)
class Sample:
    """One look at the cluster."""

    t: float
    counts: dict[str, int]
    queue: dict[str, float]               # queued + running work per role, summed over workers
    ttft: float | None = None             # seconds, mean since the previous sample
    tpot: float | None = None
    util: dict[str, float] = field(default_factory=dict)  # busy s per s, mean per worker (0..1)
    loads: dict[str, float] = field(default_factory=dict)  # `/v1/loads` running + waiting (logged)


@dataclass(frozen=True)
class Policy:
    high: float = 4.0                     # per-worker queue above which a role is short
    low: float = 0.5                      # per-worker queue at or below which a role can give one
    ttft_target: float | None = None
    tpot_target: float | None = None
    sustain: int = 3                      # consecutive agreeing samples before acting
    busy_high: float = 0.8                # per-worker utilisation at which a role is short
    busy_low: float = 0.3                 # per-worker utilisation at or below which it can give one
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
    grown: str | None = None              # the role the last move gave a worker to
    log: tuple[str, ...] = field(default=(), compare=False)


def pressure(policy: Policy, s: Sample) -> dict[str, float]:
    """Per role: the larger of per-worker queue / ``high`` and utilisation / ``busy_high``
    (>= 1 means short), raised by missed latency targets."""
    p = {r: max((s.queue.get(r, 0.0) / max(1, s.counts.get(r, 0))) / policy.high,
                s.util.get(r, 0.0) / policy.busy_high)
         for r in ROLES if s.counts.get(r, 0) > 0}
    if policy.ttft_target and s.ttft is not None:
        front = max((r for r in ("encoder", "prefill") if r in p), key=lambda r: p[r],
                    default=None)
        if front is not None:
            p[front] = max(p[front], s.ttft / policy.ttft_target)
    if policy.tpot_target and s.tpot is not None and "decode" in p:
        p["decode"] = max(p["decode"], s.tpot / policy.tpot_target)
    return p


def spare(policy: Policy, s: Sample, role: str, grown: str | None = None) -> bool:
    """``role`` can give a worker: more than one, per-worker queue <= ``low`` and utilisation
    <= ``busy_low`` (the band up to ``high`` / ``busy_high`` is the hysteresis). The role the
    last move grew (``grown``) must clear that bar with one worker fewer: its total queue and
    busy time spread over ``n - 1`` workers, so a move is undone only once its cause is gone."""
    n = s.counts.get(role, 0)
    keep = n - 1 if role == grown else n
    return (n > 1 and s.queue.get(role, 0.0) / keep <= policy.low
            and s.util.get(role, 0.0) * n / keep <= policy.busy_low)


def candidate(policy: Policy, s: Sample,
              grown: str | None = None) -> tuple[tuple[str, str] | None, str]:
    """The (target, source) pair this sample asks for, with the reason."""
    p = pressure(policy, s)
    short = [r for r in p if p[r] >= 1.0]
    if not short:
        return None, "no role is short"
    target = max(short, key=lambda r: p[r])
    donors = [r for r in p if r != target and spare(policy, s, r, grown)]
    if not donors:
        return None, f"{target} is short but no other role has a spare idle worker"
    source = min(donors, key=lambda r: p[r])
    return (target, source), (f"{target} pressure {p[target]:.2f} >= 1 ({_why(s, target)}), "
                              f"{source} spare ({_why(s, source)})")


def _why(s: Sample, role: str) -> str:
    n = max(1, s.counts.get(role, 0))
    busy = f", busy {s.util[role]:.2f}" if role in s.util else ""
    return f"queue {s.queue.get(role, 0.0) / n:.1f}/worker{busy}"


def decide(policy: Policy, st: AutoState, s: Sample) -> tuple[Proposal | None, AutoState]:
    """One policy step: a proposal when the same move was wanted ``sustain`` times, off cool-down."""
    pair, reason = candidate(policy, s, st.grown)
    if pair is None:
        return None, replace(st, candidate=None, streak=0)
    streak = st.streak + 1 if pair == st.candidate else 1
    st = replace(st, candidate=pair, streak=streak)
    if st.last_move is not None and s.t - st.last_move < policy.cooldown:
        return None, st
    if streak < policy.sustain:
        return None, st
    return Proposal(pair[0], pair[1], reason), replace(st, candidate=None, streak=0,
                                                      last_move=s.t, grown=pair[0])
