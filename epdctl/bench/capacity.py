"""What one worker of each role can do (the planner's input, written by `epdctl profile`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from epdctl.errors import EpdctlError


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
    # CPU seconds each role's process spends (what workers sharing a host's cores pay);
    # empty when the profile did not measure them: then service times stand in.
    cpu_encoder_s_per_image: float | None = None
    cpu_prefill_s_per_request: float | None = None
    cpu_decode_s_per_token: dict[int, float] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Any, source: str = "profile") -> "Profile":
        try:
            dec = {int(b): float(t) for b, t in d["decode"]["tokens_per_s"].items()}
            p = cls(encoder_images_per_s=float(d["encoder"]["images_per_s"]),
                    prefill_tokens_per_s=float(d["prefill"]["tokens_per_s"]),
                    decode_tokens_per_s=dict(sorted(dec.items())),
                    tokens_per_image=float(d["prefill"].get("tokens_per_image", 64.0)),
                    prefill_overhead_ms=float(d["prefill"].get("overhead_ms", 0.0)),
                    kv_transfer_ms=float(d.get("kv_transfer_ms", 0.0)),
                    **_cpu(d.get("cpu") or {}))
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

    def host_seconds(self, uncached_images: float, output_tokens: float, batch: float,
                     service_s: tuple[float, float]) -> tuple[float, float, float]:
        """CPU seconds one request costs (encoder, prefill, decode) on a shared host; the
        measured CPU where the profile has it, else the encode/prefill service times and the
        decode's share of a core at ``batch``."""
        enc = (uncached_images * self.cpu_encoder_s_per_image
               if self.cpu_encoder_s_per_image is not None else service_s[0])
        pre = (self.cpu_prefill_s_per_request if self.cpu_prefill_s_per_request is not None
               else service_s[1])
        if self.cpu_decode_s_per_token:
            per_tok = _interpolate(sorted(self.cpu_decode_s_per_token.items()), batch)
        else:
            per_tok = 1.0 / self.decode_tps(max(1.0, batch)) * max(1.0, batch)
        return enc, pre, output_tokens * per_tok


def _interpolate(pts: list[tuple[int, float]], x: float) -> float:
    """Linear between measured points, flat outside them."""
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[-1][1]


def _cpu(c: Any) -> dict[str, Any]:
    """The optional ``cpu`` section of a profile as Profile fields."""
    out: dict[str, Any] = {}
    if "encoder_s_per_image" in c:
        out["cpu_encoder_s_per_image"] = float(c["encoder_s_per_image"])
    if "prefill_s_per_request" in c:
        out["cpu_prefill_s_per_request"] = float(c["prefill_s_per_request"])
    if isinstance(c.get("decode_s_per_token"), dict):
        out["cpu_decode_s_per_token"] = {int(b): float(v)
                                         for b, v in sorted(c["decode_s_per_token"].items())}
    return out
