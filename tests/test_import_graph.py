"""The import graph of epdctl/ has no cycles.

Every import counts: module-level ones, lazy ones inside functions, and those under
``if TYPE_CHECKING:``. A lazy import only hides a cycle from the interpreter; the two modules still
need each other, so neither can be read, tested or moved alone. TYPE_CHECKING imports count for the
same reason: mypy and the reader follow them, and a type that both sides need belongs in a third
module both import.

``from pkg import name`` is an edge to ``pkg.name`` when ``name`` is a submodule, else to ``pkg``.
Importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``, but those edges are left out: a
package's ``__init__`` that re-exports its children would otherwise make every child a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "epdctl"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _resolve_from(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _edges(mod: str, path: Path, known: dict[str, Path]) -> set[str]:
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()

    def add(name: str) -> None:
        # the deepest epdctl module the name points at
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != mod:
            out.add(name)

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("epdctl"):
                    add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve_from(mod, is_pkg, node)
            if not target.startswith("epdctl"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                add(sub if sub in known else target)
    return out


def import_graph() -> dict[str, set[str]]:
    known = _modules()
    return {mod: _edges(mod, path, known) for mod, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _describe(comp: frozenset[str], graph: dict[str, set[str]]) -> str:
    edges = [f"{a} -> {b}" for a in sorted(comp) for b in sorted(graph[a] & comp)]
    return "{" + ", ".join(sorted(comp)) + "}: " + "; ".join(edges)


def test_no_import_cycles() -> None:
    graph = import_graph()
    bad = cycles(graph)
    assert not bad, "import cycles:\n" + "\n".join(_describe(c, graph) for c in bad)


def test_cycle_finder_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]
    src = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from epdctl import errors\n"
        "def f():\n    from epdctl.launchers import base\n    import epdctl.state\n"
    )
    path = tmp_path / "m.py"
    path.write_text(src)
    known = {"epdctl.errors": path, "epdctl.launchers": path, "epdctl.launchers.base": path, "epdctl.state": path}
    assert _edges("epdctl.m", path, known) == {"epdctl.errors", "epdctl.launchers.base", "epdctl.state"}
