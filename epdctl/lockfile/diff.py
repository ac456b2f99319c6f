"""Field-by-field comparison of two locks, and their YAML on disk.

A change is reported at the deepest path that differs (``processes.decode-0.env.NCCL_IB_HCA``);
a command is compared token by token, so one changed flag reads as the tokens removed and added
at that place, not as every later position shifted.
"""

from __future__ import annotations

import difflib
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from epdctl.errors import EpdctlError
from epdctl.lockfile.build import RUN_KEYS

_MISSING = object()


@dataclass(frozen=True)
class Change:
    path: str
    old: Any
    new: Any

    def render(self) -> str:
        if self.old is _MISSING:
            return f"  + {self.path}: {_show(self.new)}"
        if self.new is _MISSING:
            return f"  - {self.path}: {_show(self.old)}"
        return f"  ~ {self.path}: {_show(self.old)} -> {_show(self.new)}"


def _show(v: Any) -> str:
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return shlex.join(v) if v else "(nothing)"
    return "null" if v is None else str(v) if not isinstance(v, (dict, list)) else yaml.safe_dump(
        v, default_flow_style=True, sort_keys=True).strip()


def _argv(path: str, a: list[str], b: list[str]) -> list[Change]:
    out = []
    sm = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op == "equal":
            continue
        where = f"{path}[{i1}]"
        old = a[i1:i2] if i2 > i1 else _MISSING
        new = b[j1:j2] if j2 > j1 else _MISSING
        out.append(Change(where, old, new))
    return out


def diff(a: Any, b: Any, path: str = "") -> list[Change]:
    """Every field that differs between two lock documents (their ``run`` sections aside)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[Change] = []
        for key in sorted(set(a) | set(b), key=str):
            if not path and key in RUN_KEYS:
                continue
            sub = f"{path}.{key}" if path else str(key)
            if key not in a:
                out.append(Change(sub, _MISSING, b[key]))
            elif key not in b:
                out.append(Change(sub, a[key], _MISSING))
            else:
                out += diff(a[key], b[key], sub)
        return out
    if (isinstance(a, list) and isinstance(b, list) and a != b
            and all(isinstance(x, str) for x in a + b)):
        return _argv(path, a, b)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [c for i, (x, y) in enumerate(zip(a, b)) for c in diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [Change(path, a, b)]


def render(changes: list[Change]) -> str:
    return "\n".join(c.render() for c in changes)


def write(doc: dict[str, Any], path: Path) -> None:
    """Atomically, readable by the owner and group only (a lock names hosts and commands)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    text = ("# epdctl.lock: what `epdctl up` ran; compare with `epdctl diff A B`, enforce with "
            "`epdctl up TOPOLOGY --locked FILE`\n" + yaml.safe_dump(doc, sort_keys=False, width=100))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def read(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise EpdctlError(f"cannot read lock {path}: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise EpdctlError(f"lock {path}{where} is not valid YAML; write it again with "
                          f"`epdctl up --lock FILE`") from e
    if not isinstance(doc, dict) or "lock_format" not in doc:
        raise EpdctlError(f"{path} is not an epdctl lock (no lock_format key); locks are written "
                          f"by `epdctl up` into the run folder as epdctl.lock")
    return doc
