"""``validate --fix``: rewrite a topology file in place, keeping comments, key order and quoting
(ruamel.yaml round trip), then re-validate. Writes through a temporary file; never half a file."""

from __future__ import annotations

import io
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from epdctl.errors import TopologyError
from epdctl.topology.fixes import Fix

_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _walk(root: Any, path: str) -> Any:
    node = root
    for name, index in _PART.findall(path):
        node = node[int(index)] if index else node[name]
    return node


def _rewrite_mapping(old: CommentedMap, engine: str) -> CommentedMap:
    """The ``flag: value`` form, key by key: a renamed flag keeps its value, position and comment."""
    from epdctl.topology.migrations import migrate_args

    out = CommentedMap()
    for key, value in old.items():
        flag = str(key) if str(key).startswith("-") else f"--{key}"
        if value is False:
            out[key] = value
            continue
        vals = [] if value is True or value is None else (list(value) if isinstance(value, list) else [value])
        new, _ = migrate_args([flag] + [str(v) for v in vals], engine)
        groups: list[tuple[str, list[str]]] = []
        for tok in new:
            if tok.startswith("--"):
                groups.append((tok, []))
            elif groups:
                groups[-1][1].append(tok)
        for new_flag, new_vals in groups:
            new_key = new_flag[2:] if not str(key).startswith("-") else new_flag
            same_values = [str(v) for v in vals] == new_vals
            out[new_key] = value if same_values else (True if not new_vals else
                                                      new_vals[0] if len(new_vals) == 1 else new_vals)
            if key in old.ca.items and new_key not in out.ca.items:
                out.ca.items[new_key] = old.ca.items[key]
    return out


def apply_fixes(path: str | Path, fixes: list[Fix], engine: str = "sglang") -> str:
    """Rewrite ``path`` with ``fixes``; return the new text (already written)."""
    p = Path(path)
    yaml = YAML()  # round trip: comments, order and quotes survive
    yaml.preserve_quotes = True
    yaml.width = 4096
    try:
        original = p.read_text(encoding="utf-8")
        if re.search(r"^ +- ", original, re.M) and not re.search(r"^[A-Za-z_]+:\n- ", original, re.M):
            yaml.indent(mapping=2, sequence=4, offset=2)  # keep the indented "  - item" style
        data = yaml.load(original)
    except Exception as e:  # ruamel raises many types; the file was readable by the validator
        raise TopologyError(f"cannot rewrite {p}: {e}") from None
    for fix in fixes:
        holder_path, _, _ = fix.path.rpartition(".")
        holder = _walk(data, holder_path)
        old = holder["args"]
        if isinstance(old, CommentedSeq):
            old[:] = list(fix.new)
        elif isinstance(old, CommentedMap):
            holder["args"] = _rewrite_mapping(old, engine)
        if not fix.new:
            del holder["args"]
        if fix.rename_dp is not None:
            m = _walk(data, fix.rename_dp)
            if "dp" in m and "attention_dp" not in m:
                pos = list(m.keys()).index("dp")
                comment = m.ca.items.pop("dp", None)
                m.insert(pos, "attention_dp", m.pop("dp"))
                if comment is not None:
                    m.ca.items["attention_dp"] = comment
    buf = io.StringIO()
    yaml.dump(data, buf)
    text = buf.getvalue()
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=str(p.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, p)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise TopologyError(f"cannot write {p} ({e.strerror}); nothing was changed") from None
    return text
