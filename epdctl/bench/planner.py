"""Size Encoder:Prefill:Decode from measured per-worker rates. Pure: no I/O, no clock.

Model (a rate-match, like srt-slurm's for P/D, extended with the encoder):

* **encoder** work per request = images x (1 - repeat) uncached images; one worker encodes
  ``images_per_s``; a request's images are spread over the encoders, so (each with its own
  accelerator) its encode takes 1/min(encoders, images) of that. **prefill** work = prompt tokens (text + images x tokens_per_image); one
  worker prefills ``tokens_per_s``. Each stage is an M/M/1 queue per worker at rate/n, so the
  waiting time is ``s * rho / (1 - rho)``; TTFT = encode + wait + prefill + wait + KV hand-off.
* **decode**: one worker's throughput at batch b, ``tps(b)``, is interpolated between the
  measured batch sizes (1/4/16...) and flat beyond the largest. A worker that must produce D
  tokens/s runs at the smallest batch with ``tps(b) >= D`` (Little's law), so its TPOT is
  ``b / tps(b)``.
* the recommendation is the feasible split with the fewest GPUs (workers, for engines that use
  none), ties broken by the lowest peak utilisation; every role stays under ``max_util``.
* **shared host** (``host_cores``: every worker a process on the same cores, as the embedded
  engine on one CPU machine): service times stretch by the expected contention and the host's
  utilisation must stay under ``max_util`` too (``host_share``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from epdctl.bench import host_share
from epdctl.bench.capacity import PlanError, Profile

__all__ = ["PlanError", "Profile", "Demand", "SLO", "Split", "Recommendation", "evaluate",
           "recommend", "recommend_hours"]

ROLES = ("encoder", "prefill", "decode")


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
        return max(ROLES, key=lambda r: self.utilisation[r])

    def peak_role_util(self) -> float:
        return max(self.utilisation[r] for r in ROLES)

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


def evaluate(p: Profile, d: Demand, n: dict[str, int], cost_per: dict[str, int],
             host_cores: float | None = None) -> Split:
    """Predicted utilisation, TTFT and TPOT of one split (no SLO check). With ``host_cores``,
    every worker shares that many cores (see ``host_share``): service times stretch by the
    expected contention and the host's own utilisation joins the roles'."""
    uncached = d.images * (1.0 - d.repeat)
    s_enc = uncached / p.encoder_images_per_s
    tokens = d.prompt_tokens + d.images * p.tokens_per_image
    s_pre = tokens / p.prefill_tokens_per_s + p.prefill_overhead_ms / 1000.0
    dec_tps = d.rate * d.output_tokens / n["decode"]
    b, tpot = _decode_point(p, dec_tps)
    util: dict[str, float] = {}
    k = 1.0
    if host_cores:
        cpu = p.host_seconds(uncached, d.output_tokens, b if math.isfinite(b) else 1.0,
                             (s_enc, s_pre))
        work = d.rate * sum(cpu)  # cores busy on average
        util["host"] = work / host_cores
        k = host_share.contention(work, host_cores)
    s_enc, s_pre, tpot = s_enc * k, s_pre * k, tpot * k
    rho_e = d.rate * s_enc / n["encoder"]
    rho_p = d.rate * s_pre / n["prefill"]
    rho_d = dec_tps / p.decode_max_tps() * k
    # the prefill spreads one request's images over the encoders (SGLang's EPD and epdctl's
    # runtime both do): with an accelerator each, its encode takes the time of the largest
    # part; on a shared host the parts compete for the same cores (measured: no gain)
    part = s_enc if host_cores else s_enc / max(1.0, min(float(n["encoder"]), uncached))
    ttft = part + _wait(part, rho_e) + s_pre + _wait(s_pre, rho_p) + p.kv_transfer_ms / 1000.0
    cost = sum(n[r] * cost_per.get(r, 1) for r in ROLES)
    return Split(n["encoder"], n["prefill"], n["decode"], cost,
                 {"encoder": rho_e, "prefill": rho_p, "decode": rho_d, **util}, ttft * 1000.0,
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
        util = ", ".join(f"{r} {s.utilisation[r]:.0%}" for r in (*ROLES, "host")
                         if r in s.utilisation)
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


def _hopeless(p: Profile, d: Demand, slo: SLO, host_cores: float | None) -> list[str]:
    """SLOs no number of workers can meet (the unloaded pipeline is already too slow)."""
    out = []
    spread = max(1, math.ceil(d.images * (1.0 - d.repeat)))  # each image on its own encoder
    idle = evaluate(p, Demand(0.0, d.images, d.repeat, d.prompt_tokens, d.output_tokens),
                    {"encoder": spread, "prefill": 1, "decode": 1}, {})
    if host_cores:
        host = evaluate(p, d, {r: 1 for r in ROLES}, {}, host_cores).utilisation["host"]
        if host > 1.0:
            out.append(f"the workers share {host_cores:g} cores and this load needs "
                       f"{host * host_cores:.2f} of them busy ({host:.0%}) whatever the split: "
                       "add machines (give roles their own nodes) or lower the request rate")
    if slo.ttft_ms is not None and idle.ttft_ms > slo.ttft_ms:
        out.append(f"TTFT SLO {slo.ttft_ms:g} ms is below the unloaded TTFT {idle.ttft_ms:.1f} ms "
                   f"(encode + prefill + KV hand-off of one request on idle workers, its images "
                   "spread over as many encoders); more "
                   "workers cannot help: use faster workers (more tp), fewer images per request, "
                   "or relax the SLO")
    if slo.tpot_ms is not None and idle.tpot_ms > slo.tpot_ms:
        out.append(f"TPOT SLO {slo.tpot_ms:g} ms is below one decode worker's TPOT at batch 1 "
                   f"({idle.tpot_ms:.1f} ms); more decode workers cannot help: use a faster "
                   "decode (more tp) or relax the SLO")
    return out


def recommend(p: Profile, d: Demand, slo: SLO, *, gpus: int | None = None,
              cost_per: dict[str, int] | None = None, max_util: float = 0.85,
              max_per_role: int = 64, unit: str = "GPUs",
              host_cores: float | None = None) -> Recommendation:
    """The cheapest split meeting the SLOs under ``max_util`` (within ``gpus`` if given)."""
    if d.rate < 0 or d.images < 0 or not 0 <= d.repeat < 1:
        raise PlanError("demand: rate and images must be >= 0 and repeat in [0, 1)")
    cost_per = cost_per or {}
    hopeless = _hopeless(p, d, slo, host_cores)
    best: Split | None = None
    closest: Split | None = None
    # Decode is independent of E and P: its smallest count that works is fixed first.
    n_d = next((k for k in range(1, max_per_role + 1)
                if _decode_ok(evaluate(p, d, {"encoder": 1, "prefill": 1, "decode": k}, cost_per,
                                       host_cores),
                              slo, max_util)), max_per_role)
    for n_e in range(1, max_per_role + 1):
        for n_p in range(1, max_per_role + 1):
            s = evaluate(p, d, {"encoder": n_e, "prefill": n_p, "decode": n_d}, cost_per,
                         host_cores)
            if _meets(s, slo, max_util):
                if best is None or (s.cost, s.peak_role_util()) < (
                        best.cost, best.peak_role_util()):
                    best = s
                break  # more prefills for this n_e only cost more
            if closest is None or _badness(s, slo) < _badness(closest, slo):
                closest = s
    reasons = list(hopeless)
    if best is None:
        chosen = closest or evaluate(p, d, {r: max_per_role for r in ROLES}, cost_per,
                                     host_cores)
        if not hopeless:
            what = "role (and the shared host)" if host_cores else "role"
            reasons.append(f"no split with up to {max_per_role} workers per role keeps every "
                           f"{what} under {max_util:.0%} utilisation and meets the SLOs")
        chosen.feasible = False
        return Recommendation(d, slo, chosen, False, reasons, unit)
    if gpus is not None and best.cost > gpus:
        reasons.append(f"the cheapest split that meets the SLOs needs {best.cost} {unit}, but "
                       f"only {gpus} are available; add {best.cost - gpus} or lower the load")
        best.feasible = False
        return Recommendation(d, slo, best, False, reasons, unit)
    if gpus is not None and best.cost < gpus:
        reasons.append(f"{gpus - best.cost} of the {gpus} {unit} are not needed at this load")
    limits = {r: _limit(p, d, slo, best, r, cost_per, max_util, host_cores)
              for r in ROLES if best.counts[r] > 1}
    return Recommendation(d, slo, best, True, reasons, unit, limits)


def _limit(p: Profile, d: Demand, slo: SLO, s: Split, role: str, cost_per: dict[str, int],
           max_util: float, host_cores: float | None) -> str:
    """What breaks with one worker fewer of ``role``: the constraint that sized it."""
    fewer = evaluate(p, d, {**s.counts, role: s.counts[role] - 1}, cost_per, host_cores)
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
