"""Read a topology file into plain Python data plus the source line of every YAML path.

Why a custom walk over ``yaml.compose``: PyYAML's constructors drop positions, and every
validation message must name the line. Duplicate keys (which PyYAML silently overwrites) and
alias bombs are reported as problems instead of being accepted or hanging.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from epdctl.errors import Problem, TopologyError

MAX_NODES = 200_000  # YAML nodes visited (aliases count each time): stops "billion laughs" files
MAX_DEPTH = 64
MAX_BYTES = 4 * 1024 * 1024


@dataclass
class Document:
    """Parsed YAML: ``data`` (dicts/lists/scalars) and ``lines`` (YAML path -> 1-based line)."""

    data: Any
    lines: dict[str, int] = field(default_factory=dict)
    source: Path | None = None

    def line(self, path: str) -> int | None:
        """Line of ``path`` or of its closest parent that has one."""
        while True:
            if path in self.lines:
                return self.lines[path]
            if not path:
                return None
            path = parent_path(path)


def parent_path(path: str) -> str:
    """``a.b[2].c`` -> ``a.b[2]`` -> ``a.b`` -> ``a`` -> ``""``."""
    if path.endswith("]"):
        return path[: path.rindex("[")]
    return path.rpartition(".")[0]


def join(path: str, key: object) -> str:
    """Child path: ``join("roles", "prefill")`` -> ``roles.prefill``; ints become ``[i]``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def read_text(path: Path) -> str:
    """Read a topology file, turning every OS/encoding failure into a TopologyError."""
    try:
        if path.is_dir():
            raise TopologyError(f"{path} is a directory; pass a topology YAML file")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TopologyError(f"no such file: {path}; check the path (example topologies are in topologies/)") from None
    except OSError as e:
        raise TopologyError(f"cannot read {path} ({e.strerror}); check the path and permissions") from None
    if len(raw) > MAX_BYTES:
        raise TopologyError(f"{len(raw)} bytes is too large for a topology file (limit {MAX_BYTES})")
    if b"\x00" in raw:
        raise TopologyError(f"binary file (contains NUL bytes); expected a YAML topology")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise TopologyError(f"not UTF-8 text (byte {e.start}); save the topology as UTF-8 YAML") from None


def parse_yaml(text: str, source: Path | None = None) -> Document:
    """Parse one YAML document; all problems (syntax, duplicates, aliases) raise TopologyError."""
    if not text.strip() or all(not ln.strip() or ln.lstrip().startswith("#") for ln in text.splitlines()):
        raise TopologyError(
            "the topology file is empty; it needs at least name, model, engine, nodes and roles "
            "(see docs/topology.md or topologies/local.yaml)"
        )
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # its reader rejects control characters right here
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as e:
        line = e.problem_mark.line + 1 if e.problem_mark else None
        what = " ".join(x for x in (e.context, e.problem) if x)
        raise TopologyError([Problem("", line, f"invalid YAML: {what}; fix the syntax at this line")]) from None
    except yaml.reader.ReaderError as e:
        raise TopologyError(f"not a YAML text file: {e.reason} (character {e.character!r} at offset {e.position})") \
            from None
    except yaml.YAMLError as e:
        raise TopologyError(f"invalid YAML: {e}") from None
    except RecursionError:
        raise TopologyError("invalid YAML: nesting is too deep") from None
    finally:
        if loader is not None:
            loader.dispose()
    if node is None:
        raise TopologyError("the topology file holds no YAML document; start with `name: ...`")
    assert loader is not None
    walker = _Walker(loader)
    data = walker.walk(node, "", 0)
    if walker.problems:
        raise TopologyError(walker.problems)
    return Document(data, walker.lines, source)


def load_document(path: str | Path) -> Document:
    """Read and parse ``path``."""
    p = Path(path)
    return parse_yaml(read_text(p), p)


class _Walker:
    def __init__(self, loader: yaml.SafeLoader):
        self.loader = loader
        self.lines: dict[str, int] = {}
        self.problems: list[Problem] = []
        self.count = 0

    def walk(self, node: yaml.Node, path: str, depth: int) -> Any:
        self.count += 1
        if self.count > MAX_NODES or depth > MAX_DEPTH:
            if not self.problems or "too large" not in self.problems[-1].message:
                self.problems.append(Problem(path, node.start_mark.line + 1,
                                             "the YAML is too large or too deeply nested (alias expansion?); simplify it"))
            return None
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, depth)
        if isinstance(node, yaml.SequenceNode):
            return [self.walk(item, join(path, i), depth + 1) for i, item in enumerate(node.value)]
        try:
            return self.loader.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError) as e:
            self.problems.append(Problem(path, node.start_mark.line + 1, f"cannot read this value: {e}"))
            return None

    @staticmethod
    def _key_text(knode: yaml.Node) -> object:
        return knode.value if isinstance(knode, yaml.ScalarNode) else id(knode)

    def _mapping(self, node: yaml.MappingNode, path: str, depth: int) -> dict[Any, Any]:
        own = sum(1 for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge")
        try:
            self.loader.flatten_mapping(node)  # resolves `<<: *anchor` merge keys
        except yaml.YAMLError as e:
            self.problems.append(Problem(path, node.start_mark.line + 1, f"bad merge key: {e}"))
            return {}
        merged = len(node.value) - own  # flatten puts merged pairs first, the mapping's own keys last
        later = [self._key_text(k) for k, _ in node.value]
        out: dict[Any, Any] = {}
        for index, (knode, vnode) in enumerate(node.value):
            if index < merged and later[index] in later[index + 1:]:
                continue  # YAML merge: the mapping's own key (or a later merge) overrides a merged one
            line = knode.start_mark.line + 1
            if not isinstance(knode, yaml.ScalarNode):
                self.problems.append(Problem(path, line, "a mapping key must be a plain word, not a list or mapping"))
                continue
            try:
                key = self.loader.construct_object(knode)
            except (yaml.YAMLError, ValueError) as e:
                self.problems.append(Problem(path, line, f"cannot read this key: {e}"))
                continue
            if not isinstance(key, (str, int, float, bool)) or key is None:
                key = str(key)
            child = join(path, key if isinstance(key, str) else str(key))
            if key in out:
                self.problems.append(Problem(child, line, f"duplicate key {key!r} (first at line {self.lines.get(child)}); "
                                                         "remove one of them"))
                continue
            self.lines[child] = line
            out[key] = self.walk(vnode, child, depth + 1)
            self.lines[child] = line  # the key's line, not the value's
        return out
