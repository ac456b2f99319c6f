"""Records of a rebalance in progress: per-step progress events, per-move results, timing."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from epdctl.rebalance.plan import Move


@dataclass(frozen=True)
class Step:
    """Progress of one move, for the command to display."""

    move: str          # "decode-1 -> encoder-1"
    step: str          # drain | switch | stop | start | ready | register | verify | rollback | done
    seconds: float = 0.0
    detail: str = ""


@dataclass
class MoveResult:
    move: Move
    outcome: str = "pending"      # done | rolled_back | failed | skipped
    steps: dict[str, float] = field(default_factory=dict)
    error: str = ""
    link: dict[str, Any] = field(default_factory=dict)
    taken: str = ""               # the path the move really took: in-place | restart
    note: str = ""                # why an in-place move fell back to a restart

    def to_dict(self) -> dict[str, Any]:
        return {"move": self.move.to_dict(), "outcome": self.outcome, "taken": self.taken, "note": self.note,
                "steps": {k: round(v, 3) for k, v in self.steps.items()},
                "error": self.error, "link": self.link}


class Timer:
    """``with timed("stop"):`` records the step's duration and reports it."""

    def __init__(self, res: MoveResult, label: str, on_step: Callable[[Step], None]):
        self.res, self.label, self.on_step = res, label, on_step

    def __call__(self, step: str) -> "Timer":
        self.step = step
        return self

    def __enter__(self) -> None:
        self.t0 = time.monotonic()
        self.on_step(Step(self.label, self.step))

    def __exit__(self, *exc: Any) -> None:
        self.res.steps[self.step] = time.monotonic() - self.t0
        if exc[0] is None:
            self.on_step(Step(self.label, self.step, self.res.steps[self.step], "ok"))


def summary(e: BaseException) -> str:
    """First line of an error plus the last log line it quotes (the worker's own reason)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [type(e).__name__]
    return lines[0] if len(lines) == 1 else f"{lines[0]} {lines[-1]}"
