"""A module's own copy of topologies/local.yaml: its cluster name, the committed model by absolute
path, and ports ``base``..``base``+99 (apart from the session cluster's 34000s)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def local_copy(name: str, base: int) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "topologies" / "local.yaml").read_text())
    doc["name"] = name
    doc["model"]["path"] = str((ROOT / "models" / "tiny-qwen2vl").resolve())
    doc["ports"] = {"base": base, "limit": base + 99}
    return doc
