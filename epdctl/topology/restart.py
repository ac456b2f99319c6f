"""The topology's ``restart`` block: what the supervisor does when a worker dies.

The whole schema addition is this one optional top-level block::

    restart:                  # defaults shown
      policy: on-failure      # never | on-failure | always
      limit: 5                # restarts in a row (a run of 60 s or more resets the count)
      backoff: 1.0            # seconds before the first restart; doubles each time, at most 30
      standby: true           # keep a spare process with its imports done (engines that can)
      router: {policy: never} # per role (encoder, prefill, decode, colocated, router): any key above

A worker is restarted only after it has been healthy once; one that fails while starting is
reported by `up` as before (see docs/reliability.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from epdctl.topology.reader import Reader

POLICIES = ("never", "on-failure", "always")
ROLES = ("encoder", "prefill", "decode", "colocated", "router")
KEYS = ("policy", "limit", "backoff", "standby")


@dataclass(frozen=True)
class RestartPolicy:
    policy: str = "on-failure"
    limit: int = 5
    backoff: float = 1.0
    standby: bool = True    # a warm spare per worker, where the engine's workers can wait as one

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _one(r: Reader, m: dict[str, Any], path: str, base: RestartPolicy) -> RestartPolicy:
    return RestartPolicy(
        policy=r.get(m, path, "policy", "str", default=base.policy, choices=POLICIES),
        limit=r.get(m, path, "limit", "int", default=base.limit, minimum=0, maximum=1000),
        backoff=float(r.get(m, path, "backoff", "float", default=base.backoff)),
        standby=bool(r.get(m, path, "standby", "bool", default=base.standby)))


def read_restart(r: Reader, top: dict[str, Any]) -> dict[str, RestartPolicy]:
    """role -> policy, for every role (the defaults when the block is absent)."""
    base = RestartPolicy()
    m = r.section(top, "restart", KEYS + ROLES)
    if m is None:
        return {role: base for role in ROLES}
    base = _one(r, m, "restart", base)
    if not 0 < base.backoff <= 600:
        r.problem("restart.backoff", f"backoff must be between 0 and 600 seconds, got {base.backoff}")
    out: dict[str, RestartPolicy] = {}
    for role in ROLES:
        sub = m.get(role)
        if sub is None:
            out[role] = base
            continue
        sm = r.mapping(sub, f"restart.{role}", KEYS, f"restart.{role}")
        out[role] = _one(r, sm, f"restart.{role}", base) if sm is not None else base
    return out
