"""Plain records shared by the node checks: what a node must offer, what it reported, and
one pass/fail item. Kept apart so the NIC checks and the host checks can both use them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

RDMA_KINDS = ("ib", "roce")


@dataclass(frozen=True)
class NicExpect:
    """A NIC the topology declares: RDMA device name (ib/roce) or netdev name (eth)."""

    name: str
    kind: str                 # ib | roce | eth
    ip: str | None = None
    speed_gbps: float | None = None
    port: int | None = None   # the HCA port used (None: port 1, the engines' default)


@dataclass(frozen=True)
class NodeExpect:
    """What a node must offer for the plan to run on it."""

    node: str
    nics: tuple[NicExpect, ...] = ()
    gpus: int = 0
    model_path: str | None = None
    ports: tuple[tuple[str, int], ...] = ()     # (bind host, port) the plan's processes need
    min_disk_gb: float = 1.0
    rdma_transport: bool = False                # the transfer engine runs over ib/roce here


@dataclass(frozen=True)
class CheckItem:
    node: str
    check: str                # short id: "nic mlx5_0 state", "ulimit -l", ...
    ok: bool                  # False only for a failure; a warning is ok (unless --strict)
    detail: str
    level: str = ""           # ok | warn | fail; '' means derived from ``ok``

    @property
    def status(self) -> str:
        return self.level or ("ok" if self.ok else "fail")

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "check": self.check, "ok": self.ok, "level": self.status,
                "detail": self.detail}


@dataclass
class Facts:
    """Raw outputs of one node's probes: ``{probe: {"rc": int, "out": str}}`` plus versions."""

    node: str
    probes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    versions: Mapping[str, str | None] = field(default_factory=dict)
    path_exists: Mapping[str, bool] = field(default_factory=dict)

    def out(self, probe: str) -> str | None:
        """The probe's stdout when it ran and exited 0, else None."""
        p = self.probes.get(probe)
        if not p or p.get("rc") != 0:
            return None
        return str(p.get("out", ""))

    def text(self, probe: str) -> str | None:
        """What the probe printed (stdout, then stderr) whatever its exit status: a tool that
        exits 1 may have printed healthy devices. None when not collected or not installed."""
        p = self.probes.get(probe)
        if not p:
            return None
        out, err = str(p.get("out") or ""), str(p.get("err") or "")
        if p.get("rc") == 127 and not out:
            return None
        return out + ("\n" + err if err.strip() else "")

    def why_missing(self, probe: str) -> str:
        p = self.probes.get(probe)
        if not p:
            return "not collected"
        err = (str(p.get("err") or p.get("out") or "")).strip().splitlines()
        return f"exit {p.get('rc')}: {err[-1] if err else 'no output'}"


def item(expect: NodeExpect, check: str, ok: bool, detail: str) -> CheckItem:
    """One item for the expected node."""
    return CheckItem(expect.node, check, ok, detail)


def leveled(expect: NodeExpect, check: str, level: str, detail: str) -> CheckItem:
    """One item at a judgement level (pass/ok, warn, fail)."""
    status = {"pass": "ok"}.get(level, level)
    return CheckItem(expect.node, check, status != "fail", detail, status)
