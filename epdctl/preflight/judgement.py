"""What reading one tool's output yields: the tool, the facts read, and findings (pass, warn or
fail, each with a message and advice specific to the cause).

Why one shape for every tool: `epdctl diagnose` prints it for a pasted file, and `epdctl check`
turns the same findings into its ok/warn/fail items, so a judgement is made in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PASS, WARN, FAIL = "pass", "warn", "fail"
_RANK = {PASS: 0, WARN: 1, FAIL: 2}
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Finding:
    level: str          # pass | warn | fail
    message: str        # what is wrong (or what was found)
    advice: str = ""    # what to do, specific to the cause

    def to_json(self) -> dict[str, str]:
        return {"level": self.level, "message": self.message, "advice": self.advice}


@dataclass
class Judgement:
    """One tool output judged. ``tool`` is ``unknown`` when the text could not be attributed."""

    tool: str  # the program as users name it: ib_write_bw, transfer_engine_bench, nvidia-smi -q, ibstatus
    facts: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    family: str = ""  # the reader that judged it, when it covers several programs: perftest, mooncake

    @property
    def kind(self) -> str:
        """The family: perftest, mooncake, nvidia-smi, rdma, host (the tool itself where unknown)."""
        if self.family:
            return self.family
        first = self.tool.split(" ")[0]
        return {"ibv_devinfo": "rdma", "ibstat": "rdma", "ibstatus": "rdma", "ibv_devices": "rdma",
                "rdma": "rdma", "show_gids": "rdma", "ibdev2netdev": "rdma", "lsmod": "host",
                "ulimit": "host"}.get(first, first)

    @property
    def verdict(self) -> str:
        if self.tool == UNKNOWN:
            return FAIL
        return max((f.level for f in self.findings), key=_RANK.__getitem__, default=PASS)

    def add(self, level: str, message: str, advice: str = "") -> None:
        self.findings.append(Finding(level, message, advice))

    def to_json(self) -> dict[str, Any]:
        return {"tool": self.tool, "family": self.kind, "verdict": self.verdict, "facts": self.facts,
                "findings": [f.to_json() for f in self.findings]}


def worst(levels: list[str]) -> str:
    return max(levels, key=_RANK.__getitem__, default=PASS)


def not_recognised(why: str) -> Judgement:
    j = Judgement(UNKNOWN)
    j.add(FAIL, f"not recognised: {why}",
          "save the complete output of one of the supported tools (see docs/check.md), "
          "one tool per file, and run `epdctl diagnose` on it again")
    return j


def digits(s: str) -> bool:
    """ASCII decimal digits only (``str.isdigit`` accepts '²', which ``int`` rejects)."""
    return bool(s) and s.isascii() and s.isdigit()
