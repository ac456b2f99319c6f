"""Version advice on a topology's engine ``args``: what SGLang 0.5.23 removed, deprecated or reads
as an abbreviation, each with its exact replacement. ``validate`` prints them; ``validate --fix``
applies them (epdctl/topology/rewrite.py); ``epdctl import`` applies the same table to scripts.

Works on the parsed document, not the built topology, so the advice is there even when other
problems stop the topology from loading.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterator

from epdctl.topology.loader import Document
from epdctl.topology.migrations import Applied, migrate_args
from epdctl.topology.reader import Reader


@dataclass(frozen=True)
class Fix:
    """Rewrite the args at ``path`` from ``old`` to ``new``; ``rename_dp`` moves a dp key to attention_dp."""

    path: str
    line: int | None
    old: tuple[str, ...]
    new: tuple[str, ...]
    applied: tuple[Applied, ...]
    rename_dp: str | None = None  # YAML path of the mapping whose dp key becomes attention_dp

    def messages(self, *, warnings_only: bool = False) -> Iterator[str]:
        """One line per rewrite; ``warnings_only`` leaves out removed flags (validate reports those as
        problems already)."""
        for a in self.applied:
            m = a.migration
            if warnings_only and (a.old and a.old[0].startswith("---") or (m is not None and m.status == "removed")):
                continue
            if m is None:
                yield f"{a.describe()}"
            elif m.kind == "dp_attention":
                where = f"dp at {self.rename_dp}" if self.rename_dp else "dp"
                yield (f"{' '.join(a.old)} is SGLang's deprecated spelling of attention DP: epdctl reads {where} "
                       f"plus this flag as attention_dp (rendered --attn-dp-size); write attention_dp instead")
            else:
                yield f"{m.summary()}; seen: {' '.join(a.old)}; evidence: {m.evidence}"


def _args_paths(data: Any) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(args path, the mapping holding it, that mapping's path) for every args key of workers' layers."""
    if not isinstance(data, dict):
        return
    if isinstance(data.get("defaults"), dict):
        yield "defaults.args", data["defaults"], "defaults"
    nd = data.get("node_defaults")
    if isinstance(nd, dict) and isinstance(nd.get("defaults"), dict):
        yield "node_defaults.defaults.args", nd["defaults"], "node_defaults.defaults"
    nodes = data.get("nodes")
    for i, node in enumerate(nodes if isinstance(nodes, list) else []):
        if isinstance(node, dict) and isinstance(node.get("defaults"), dict):
            yield f"nodes[{i}].defaults.args", node["defaults"], f"nodes[{i}].defaults"
    roles = data.get("roles")
    if isinstance(roles, dict):
        for role, m in roles.items():
            if not isinstance(m, dict):
                continue
            yield f"roles.{role}.args", m, f"roles.{role}"
            workers = m.get("workers")
            for j, w in enumerate(workers if isinstance(workers, list) else []):
                if isinstance(w, dict):
                    yield f"roles.{role}.workers[{j}].args", w, f"roles.{role}.workers[{j}]"


def find_fixes(doc: Document) -> list[Fix]:
    """Every args list that the installed engine's migrations would rewrite."""
    data = doc.data
    engine = data.get("engine") if isinstance(data, dict) else None
    if not isinstance(engine, str):
        return []
    scratch = Reader(doc)  # problems in args are reported by the real read; ignore them here
    out: list[Fix] = []
    for path, holder, holder_path in _args_paths(data):
        if "args" not in holder or holder.get("args") is None:
            continue
        tokens = list(scratch.args(holder, holder_path))
        new, applied = migrate_args(tokens, engine)
        if not applied:
            continue
        dp_holder = None
        if any(a.migration is not None and a.migration.kind == "dp_attention" for a in applied):
            dp_holder = _dp_holder(data, holder, holder_path)
        out.append(Fix(path, doc.line(path), tuple(tokens), tuple(new), tuple(applied), dp_holder))
    return out


def _dp_holder(data: dict[str, Any], holder: dict[str, Any], holder_path: str) -> str | None:
    """Where the dp of ``dp + --enable-dp-attention`` is written: the same layer, else a lower one."""
    if isinstance(holder.get("dp"), int):
        return holder_path
    m = re.match(r"roles\.(\w+)\.workers\[\d+\]$", holder_path)
    if m and isinstance(data["roles"][m.group(1)].get("dp"), int):
        return f"roles.{m.group(1)}"
    if isinstance(data.get("defaults"), dict) and isinstance(data["defaults"].get("dp"), int):
        return "defaults"
    return None


__all__ = ["Fix", "find_fixes"]
