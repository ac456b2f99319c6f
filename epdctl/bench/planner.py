"""Size Encoder:Prefill:Decode from measured per-worker rates. Pure: no I/O, no clock.

Model (a rate-match, like srt-slurm's for P/D, extended with the encoder):

* **encoder** work per request = images x (1 - repeat) uncached images; one worker encodes
  ``images_per_s``. **prefill** work = prompt tokens (text + images x tokens_per_image); one
  worker prefills ``tokens_per_s``. Each stage is an M/M/1 queue per worker at rate/n, so the
  waiting time is ``s * rho / (1 - rho)``; TTFT = encode + wait + prefill + wait + KV hand-off.
* **decode**: one worker's throughput at batch b, ``tps(b)``, is interpolated between the
  measured batch sizes (1/4/16...) and flat beyond the largest. A worker that must produce D
  tokens/s runs at the smallest batch with ``tps(b) >= D`` (Little's law), so its TPOT is
  ``b / tps(b)``.
* the recommendation is the feasible split with the fewest GPUs (workers, for engines that use
  none), ties broken by the lowest peak utilisation; every role stays under ``max_util``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from epdctl.errors import EpdctlError

ROLES = ("encoder", "prefill", "decode")


class PlanError(EpdctlError):
    """A profile, workload or topology cannot be planned with."""


@dataclass(frozen=True)
class Profile:
    """Per-worker capacity of each role (what `epdctl profile` measures)."""

    encoder_images_per_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: dict[int, float]    # batch size -> aggregate tokens/s of one worker
    tokens_per_image: float = 64.0
    prefill_overhead_ms: float = 0.0         # fixed cost per request (scheduling, transfer setup)
    kv_transfer_ms: float = 0.0

    @classmethod
    def from_dict(cls, d: Any, source: str = "profile") -> "Profile":
        try:
            dec = {int(b): float(t) for b, t in d["decode"]["tokens_per_s"].items()}
            p = cls(encoder_images_per_s=float(d["encoder"]["images_per_s"]),
                    prefill_tokens_per_s=float(d["prefill"]["tokens_per_s"]),
                    decode_tokens_per_s=dict(sorted(dec.items())),
                    tokens_per_image=float(d["prefill"].get("tokens_per_image", 64.0)),
                    prefill_overhead_ms=float(d["prefill"].get("overhead_ms", 0.0)),
                    kv_transfer_ms=float(d.get("kv_transfer_ms", 0.0)))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise PlanError(f"{source}: not a profile (missing or bad {e}); make one with "
                            "`epdctl profile CLUSTER --out P.json`") from None
        if (p.encoder_images_per_s <= 0 or p.prefill_tokens_per_s <= 0 or not dec
                or min(dec) < 1 or any(t <= 0 for t in dec.values())):
            raise PlanError(f"{source}: rates must be > 0 and decode needs batch sizes >= 1")
        return p

    def decode_tps(self, b: float) -> float:
        """Tokens/s of one decode worker at batch ``b`` (linear between measured points)."""
        pts = [(0.0, 0.0)] + [(float(k), v) for k, v in self.decode_tokens_per_s.items()]
        for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
            if b <= b1:
                return t0 + (t1 - t0) * (b - b0) / (b1 - b0)
        return pts[-1][1]

    def decode_max_tps(self) -> float:
        return max(self.decode_tokens_per_s.values())


@dataclass(frozen=True)
class Demand:
    """The workload as averages: what each role must process per second."""

    rate: float                 # requests/s
    images: float               # mean images per request
    repeat: float = 0.0         # share of images served from the embedding cache
    prompt_tokens: float = 12.0  # text tokens besides the images
    output_tokens: float = 32.0


@dataclass(frozen=True)
class SLO:
    ttft_ms: float | None = None
    tpot_ms: float | None = None


@dataclass
class Split:
    """One E:P:D choice and what the model predicts for it."""

    encoder: int
    prefill: int
    decode: int
    cost: int
    utilisation: dict[str, float]
    ttft_ms: float
    tpot_ms: float
    feasible: bool = True
    problems: list[str] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        return {"encoder": self.encoder, "prefill": self.prefill, "decode": self.decode}

    @property
    def bottleneck(self) -> str:
        return max(self.utilisation, key=lambda r: self.utilisation[r])

    def ratio(self) -> str:
        return f"{self.encoder}:{self.prefill}:{self.decode}"

    def to_dict(self) -> dict[str, Any]:
        return {"split": self.ratio(), "counts": self.counts, "cost": self.cost,
                "utilisation": {k: round(v, 4) for k, v in self.utilisation.items()},
                "bottleneck": self.bottleneck, "ttft_ms": _r(self.ttft_ms),
                "tpot_ms": _r(self.tpot_ms), "feasible": self.feasible, "problems": self.problems}


def _r(x: float) -> float | None:
    return None if math.isinf(x) or math.isnan(x) else round(x, 3)


def _wait(service_s: float, rho: float) -> float:
    return math.inf if rho >= 1.0 else service_s * rho / (1.0 - rho)


def _decode_point(p: Profile, tokens_per_s: float) -> tuple[float, float]:
    """(batch, TPOT seconds) of a decode worker that must emit ``tokens_per_s``."""
    if tokens_per_s > p.decode_max_tps():
        return math.inf, math.inf
    lo, hi = 0.0, float(max(p.decode_tokens_per_s))
    for _ in range(60):  # tps(b) is monotone between measured points: bisect for the batch
        mid = (lo + hi) / 2
        if p.decode_tps(mid) >= tokens_per_s:
            hi = mid
        else:
            lo = mid
    b = max(1.0, hi)
    return b, b / p.decode_tps(b)


def evaluate(p: Profile, d: Demand, n: dict[str, int], cost_per: dict[str, int]) -> Split:
    """Predicted utilisation, TTFT and TPOT of one split (no SLO check)."""
    uncached = d.images * (1.0 - d.repeat)
    s_enc = uncached / p.encoder_images_per_s
    tokens = d.prompt_tokens + d.images * p.tokens_per_image
    s_pre = tokens / p.prefill_tokens_per_s + p.prefill_overhead_ms / 1000.0
    rho_e = d.rate * s_enc / n["encoder"]
    rho_p = d.rate * s_pre / n["prefill"]
    dec_tps = d.rate * d.output_tokens / n["decode"]
    _, tpot = _decode_point(p, dec_tps)
    rho_d = dec_tps / p.decode_max_tps()
    ttft = s_enc + _wait(s_enc, rho_e) + s_pre + _wait(s_pre, rho_p) + p.kv_transfer_ms / 1000.0
    cost = sum(n[r] * cost_per.get(r, 1) for r in ROLES)
    return Split(n["encoder"], n["prefill"], n["decode"], cost,
                 {"encoder": rho_e, "prefill": rho_p, "decode": rho_d}, ttft * 1000.0,
                 tpot * 1000.0)


@dataclass
class Recommendation:
    """The plan for one demand: the chosen split (or the best infeasible one) and why."""

    demand: Demand
    slo: SLO
    split: Split
    feasible: bool
    reasons: list[str]
    unit: str = "GPUs"
    limits: dict[str, str] = field(default_factory=dict)

    def explain(self) -> list[str]:
        s = self.split
        util = ", ".join(f"{r} {s.utilisation[r]:.0%}" for r in ROLES)
        lines = [f"E:P:D = {s.ratio()} ({s.cost} {self.unit}); predicted TTFT {_fmt(s.ttft_ms)} ms, "
                 f"TPOT {_fmt(s.tpot_ms)} ms",
                 f"utilisation: {util}; busiest role: {s.bottleneck}"]
        lines += [f"why {n} {r}: {self.limits[r]}" for r in ROLES
                  if (n := s.counts[r]) and r in self.limits]
        return lines + [("infeasible: " if not self.feasible else "note: ") + r for r in self.reasons]

    def to_dict(self) -> dict[str, Any]:
        return {"demand": self.demand.__dict__, "slo": self.slo.__dict__, "feasible": self.feasible,
                "reasons": self.reasons, "unit": self.unit, "limits": self.limits,
                **self.split.to_dict()}


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.1f}"


def _meets(s: Split, slo: SLO, max_util: float) -> bool:
    if any(u > max_util for u in s.utilisation.values()):
        return False
    if slo.ttft_ms is not None and s.ttft_ms > slo.ttft_ms:
        return False
    return slo.tpot_ms is None or s.tpot_ms <= slo.tpot_ms


def _hopeless(p: Profile, d: Demand, slo: SLO) -> list[str]:
    """SLOs no number of workers can meet (the unloaded pipeline is already too slow)."""
    out = []
    idle = evaluate(p, Demand(0.0, d.images, d.repeat, d.prompt_tokens, d.output_tokens),
                    {r: 1 for r in ROLES}, {})
    if slo.ttft_ms is not None and idle.ttft_ms > slo.ttft_ms:
        out.append(f"TTFT SLO {slo.ttft_ms:g} ms is below the unloaded TTFT {idle.ttft_ms:.1f} ms "
                   f"(encode + prefill + KV hand-off of one request on idle workers); more "
                   "workers cannot help: use faster workers (more tp), fewer images per request, "
                   "or relax the SLO")
    if slo.tpot_ms is not None and idle.tpot_ms > slo.tpot_ms:
        out.append(f"TPOT SLO {slo.tpot_ms:g} ms is below one decode worker's TPOT at batch 1 "
                   f"({idle.tpot_ms:.1f} ms); more decode workers cannot help: use a faster "
                   "decode (more tp) or relax the SLO")
    return out


def recommend(p: Profile, d: Demand, slo: SLO, *, gpus: int | None = None,
              cost_per: dict[str, int] | None = None, max_util: float = 0.85,
              max_per_role: int = 64, unit: str = "GPUs") -> Recommendation:
    """The cheapest split meeting the SLOs under ``max_util`` (within ``gpus`` if given)."""
    if d.rate < 0 or d.images < 0 or not 0 <= d.repeat < 1:
        raise PlanError("demand: rate and images must be >= 0 and repeat in [0, 1)")
    cost_per = cost_per or {}
    hopeless = _hopeless(p, d, slo)
    best: Split | None = None
    closest: Split | None = None
    # Decode is independent of E and P: its smallest count that works is fixed first.
    n_d = next((k for k in range(1, max_per_role + 1)
                if _decode_ok(evaluate(p, d, {"encoder": 1, "prefill": 1, "decode": k}, cost_per),
                              slo, max_util)), max_per_role)
    for n_e in range(1, max_per_role + 1):
        for n_p in range(1, max_per_role + 1):
            s = evaluate(p, d, {"encoder": n_e, "prefill": n_p, "decode": n_d}, cost_per)
            if _meets(s, slo, max_util):
                if best is None or (s.cost, max(s.utilisation.values())) < (
                        best.cost, max(best.utilisation.values())):
                    best = s
                break  # more prefills for this n_e only cost more
            if closest is None or _badness(s, slo) < _badness(closest, slo):
                closest = s
    reasons = list(hopeless)
    if best is None:
        chosen = closest or evaluate(p, d, {r: max_per_role for r in ROLES}, cost_per)
        if not hopeless:
            reasons.append(f"no split with up to {max_per_role} workers per role keeps every "
                           f"role under {max_util:.0%} utilisation and meets the SLOs")
        chosen.feasible = False
        return Recommendation(d, slo, chosen, False, reasons, unit)
    if gpus is not None and best.cost > gpus:
        reasons.append(f"the cheapest split that meets the SLOs needs {best.cost} {unit}, but "
                       f"only {gpus} are available; add {best.cost - gpus} or lower the load")
        best.feasible = False
        return Recommendation(d, slo, best, False, reasons, unit)
    if gpus is not None and best.cost < gpus:
        reasons.append(f"{gpus - best.cost} of the {gpus} {unit} are not needed at this load")
    limits = {r: _limit(p, d, slo, best, r, cost_per, max_util) for r in ROLES if best.counts[r] > 1}
    return Recommendation(d, slo, best, True, reasons, unit, limits)


def _limit(p: Profile, d: Demand, slo: SLO, s: Split, role: str, cost_per: dict[str, int],
           max_util: float) -> str:
    """What breaks with one worker fewer of ``role``: the constraint that sized it."""
    fewer = evaluate(p, d, {**s.counts, role: s.counts[role] - 1}, cost_per)
    if fewer.utilisation[role] > max_util:
        return (f"with {s.counts[role] - 1} its utilisation would be "
                f"{fewer.utilisation[role]:.0%} (> {max_util:.0%})")
    if slo.ttft_ms is not None and fewer.ttft_ms > slo.ttft_ms:
        return f"with {s.counts[role] - 1} TTFT would be {_fmt(fewer.ttft_ms)} ms (> {slo.ttft_ms:g} ms)"
    if slo.tpot_ms is not None and fewer.tpot_ms > slo.tpot_ms:
        return f"with {s.counts[role] - 1} TPOT would be {_fmt(fewer.tpot_ms)} ms (> {slo.tpot_ms:g} ms)"
    return "ties on cost; this split has the lowest peak utilisation"


def _decode_ok(s: Split, slo: SLO, max_util: float) -> bool:
    return s.utilisation["decode"] <= max_util and (slo.tpot_ms is None or s.tpot_ms <= slo.tpot_ms)


def _badness(s: Split, slo: SLO) -> tuple[float, float]:
    over = max(s.utilisation.values())
    ttft = s.ttft_ms / slo.ttft_ms if slo.ttft_ms else 0.0
    return (max(over, ttft), s.cost)


def recommend_hours(p: Profile, base: Demand, hours: dict[int, float], slo: SLO,
                    **kw: Any) -> dict[int, Recommendation]:
    """One recommendation per hour of day (the request rate changes, the request shape not)."""
    return {h: recommend(p, Demand(rate, base.images, base.repeat, base.prompt_tokens,
                                   base.output_tokens), slo, **kw)
            for h, rate in sorted(hours.items())}
