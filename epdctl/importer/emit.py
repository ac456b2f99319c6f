"""Write an imported topology as YAML with a comment at every guess (block style; args as a flow
list with one flag and its values per line, so a diff against the script reads naturally)."""

from __future__ import annotations

from typing import Any

import yaml

from epdctl.importer.build import Draft

ORDER = ("name", "engine", "launcher", "model", "defaults", "container", "transfer", "nodes", "roles", "router")


def scalar(v: Any) -> str:
    if isinstance(v, str) and v.isdigit() and not (len(v) > 1 and v.startswith("0")):
        return v  # read back as str(int) == v by the args reader
    return yaml.safe_dump([v], default_flow_style=True, width=1 << 20).strip()[1:-1]


def _args(tokens: list[str], indent: str) -> list[str]:
    groups: list[list[str]] = []
    for tok in tokens:
        if tok.startswith("-") or not groups:
            groups.append([tok])
        else:
            groups[-1].append(tok)
    inner = [indent + "  " + ", ".join(scalar(t) for t in g) + "," for g in groups]
    return ["["] + inner + [indent + "]"]


def _emit(value: Any, path: str, indent: str, comments: dict[str, str], out: list[str]) -> None:
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, v in items:
        child = f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else key)
        note = f"  # {comments[child]}" if child in comments else ""
        lead = f"{indent}- " if isinstance(key, int) else f"{indent}{key}:"
        if isinstance(key, int) and isinstance(v, dict):
            first = True
            for k2, v2 in v.items():
                sub = f"{child}.{k2}"
                n2 = f"  # {comments[sub]}" if sub in comments else ""
                pre = lead if first else indent + "  "
                if first and child in comments:
                    n2 = f"  # {comments[child]}" + (f"; {n2[4:]}" if n2 else "")
                first = False
                if isinstance(v2, (dict, list)) and v2 and not (k2 == "args"):
                    if isinstance(v2, list) and all(not isinstance(x, (dict, list)) for x in v2):
                        out.append(f"{pre}{k2}: [{', '.join(scalar(x) for x in v2)}]{n2}")
                    else:
                        out.append(f"{pre}{k2}:{n2}")
                        _emit(v2, sub, indent + "    ", comments, out)
                elif k2 == "args":
                    lines = _args(v2, indent + "  ")
                    out.append(f"{pre}args: {lines[0]}{n2}")
                    out.extend(lines[1:])
                else:
                    out.append(f"{pre}{k2}: {scalar(v2)}{n2}")
            continue
        if isinstance(v, dict) and v:
            out.append(f"{lead}{note}")
            _emit(v, child, indent + "  ", comments, out)
        elif isinstance(v, list) and v and key == "args":
            lines = _args(v, indent)
            out.append(f"{lead} {lines[0]}{note}")
            out.extend(lines[1:])
        elif isinstance(v, list) and v and all(not isinstance(x, (dict, list)) for x in v):
            out.append(f"{lead} [{', '.join(scalar(x) for x in v)}]{note}")
        elif isinstance(v, list) and v:
            out.append(f"{lead}{note}")
            _emit(v, child, indent + "  ", comments, out)
        else:
            out.append(f"{lead} {scalar(v)}{note}" if not isinstance(key, int) else f"{lead}{scalar(v)}{note}")


def to_yaml(d: Draft, sources: list[str]) -> str:
    out = [f"# Imported by `epdctl import` from {', '.join(sources)}.",
           "# Every guess carries a comment; check them, then `epdctl validate` and `epdctl render`."]
    if d.migrations:
        out.append("# Flags migrated to SGLang 0.5.23:")
        out += [f"#   {m}" for m in d.migrations]
    if d.notes:
        out.append("# Notes:")
        out += [f"#   {n}" for n in d.notes]
    ordered = {k: d.data[k] for k in ORDER if k in d.data}
    _emit(ordered, "", "", d.comments, out)
    return "\n".join(out) + "\n"
