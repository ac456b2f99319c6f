"""The migration table of an engine's flags (``flags/<table>_migrations.json``): flags that
published launch commands use and the installed release removed or deprecated, each with what
replaces it. :mod:`epdctl.topology.migrations` applies it; flag tables name it in their messages."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources


@dataclass(frozen=True)
class Migration:
    flag: str
    status: str  # removed | deprecated
    kind: str  # rename | replace | drop | dp_attention | ep_from_tp
    replacement: tuple[str, ...]
    takes_value: bool = False
    note: str = ""
    deprecated_in: str = ""
    removed_by: str | None = None
    evidence: str = ""

    def why(self) -> str:
        why = f"removed by SGLang {self.removed_by}" if self.status == "removed" else "deprecated in SGLang 0.5.23"
        return why + (f"; {self.note}" if self.note else "")

    def summary(self) -> str:
        """``--enable-deepep-moe -> --moe-a2a-backend deepep (removed by SGLang 0.5.23)``."""
        new = " ".join(self.replacement) if self.replacement else "drop it"
        return f"{self.flag} -> {new} ({self.why()})"


@lru_cache(maxsize=None)
def migration_table(table_name: str) -> dict[str, Migration]:
    """Known migrations of the flag table ``table_name`` by old flag (empty for tables without any)."""
    path = resources.files("epdctl.topology").joinpath("flags", f"{table_name}_migrations.json")
    if not path.is_file():
        return {}
    doc = json.loads(path.read_text(encoding="utf-8"))
    return {m["flag"]: Migration(flag=m["flag"], status=m["status"], kind=m["kind"],
                                 replacement=tuple(m["replacement"]), takes_value=bool(m.get("takes_value")),
                                 note=m.get("note", ""), deprecated_in=m.get("deprecated_in", ""),
                                 removed_by=m.get("removed_by"), evidence=m.get("evidence", ""))
            for m in doc["migrations"]}
