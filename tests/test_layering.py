"""The two halves of epdctl never import each other, and the CLI stays light.

The control plane (everything under epdctl/ except runtime/) must run on a login node without
torch; the runtime must run on a GPU node without the control plane's dependencies. Their only
contracts are the rendered command line and the HTTP API.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "epdctl"
HEAVY = {"torch", "transformers", "tokenizers", "safetensors", "numpy"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _modules(runtime: bool) -> list[Path]:
    files = sorted(PKG.rglob("*.py"))
    return [f for f in files if (PKG / "runtime" in f.parents) == runtime]


def test_control_plane_never_imports_runtime_or_torch() -> None:
    bad = []
    for f in _modules(runtime=False):
        for name in _imports(f):
            top = name.split(".")[0]
            if name.startswith("epdctl.runtime") or top in HEAVY:
                bad.append(f"{f.relative_to(PKG.parent)} imports {name}")
    assert not bad, "\n".join(bad)


def test_runtime_never_imports_control_plane() -> None:
    bad = []
    for f in _modules(runtime=True):
        for name in _imports(f):
            if name == "epdctl" or (name.startswith("epdctl.") and not name.startswith("epdctl.runtime")):
                bad.append(f"{f.relative_to(PKG.parent)} imports {name}")
    assert not bad, "\n".join(bad)


def test_cli_import_does_not_load_torch() -> None:
    code = (
        "import sys, epdctl.cli\n"
        "from epdctl.cli import _COMMANDS\n"
        "import importlib\n"
        "for mod, _ in set(_COMMANDS.values()):\n"
        "    importlib.import_module('epdctl.commands.' + mod)\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'epdctl.runtime') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_test_modules_have_distinct_names() -> None:
    """pytest imports test files without packages by their basename (rootdir conftest style): two
    files with one name in different folders break collection of the whole suite."""
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted((PKG.parent / "tests").rglob("test_*.py")):
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(PKG.parent)} and {path.relative_to(PKG.parent)}")
        seen.setdefault(path.name, path)
    assert not clashes, "rename one of each pair: " + "; ".join(clashes)


ENGINE_HOMES = ("engines",)  # the only place an engine's name may decide behaviour
LAUNCHER_HOMES = ("launchers", "slurm")  # likewise a launcher's (slurm/ is the SLURM launcher)


def _identifiers(expr: ast.expr) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(expr):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            out.add(str(node.slice.value))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            out.add(str(node.args[0].value))  # data.get("launcher")
    return out


def _literals(expr: ast.expr) -> set[str]:
    items = expr.elts if isinstance(expr, (ast.Tuple, ast.List, ast.Set)) else [expr]
    return {e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)}


def name_comparisons(root: Path, names: set[str], words: tuple[str, ...], homes: tuple[str, ...]) -> list[str]:
    """``file:line`` of every ==/!=/in/not in between something called like ``words`` (engine,
    topo.engine, self.launcher, data["launcher"], a launch's kind) and one of ``names`` as a
    literal, outside ``homes`` (and the runtime, which has no engines or launchers)."""
    bad = []
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root)
        if rel.parts[0] in homes or rel.parts[0] == "runtime":
            continue
        for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            for a, op, b in zip(sides, node.ops, sides[1:]):
                if not isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                    continue
                for x, y in ((a, b), (b, a)):
                    if _literals(y) & names and any(w in i for i in _identifiers(x) for w in words):
                        bad.append(f"{rel}:{node.lineno}")
    return sorted(set(bad))


def test_no_engine_or_launcher_is_branched_on_by_name() -> None:
    """Engines and launchers are records (epdctl/engines/, epdctl/launchers/kinds.py): the rest
    of the control plane reads their attributes, never compares their names."""
    from epdctl.engines import ENGINE_NAMES
    from epdctl.launchers.kinds import LAUNCHER_NAMES

    engines = name_comparisons(PKG, set(ENGINE_NAMES), ("engine", "kind"), ENGINE_HOMES)
    launchers = name_comparisons(PKG, set(LAUNCHER_NAMES), ("launcher",), LAUNCHER_HOMES)
    assert engines == [], f"engine names compared outside epdctl/engines/: {engines}"
    assert launchers == [], f"launcher names compared outside epdctl/launchers/: {launchers}"
    # and the plain-text form of the same rule, as `grep 'engine ==\|engine !='` reads it
    import re

    text = re.compile(r"\bengine\s*(==|!=)|\blauncher\s*(==|!=)")
    hits = [f"{f.relative_to(PKG)}:{i}" for f in sorted(PKG.rglob("*.py"))
            if f.relative_to(PKG).parts[0] not in ENGINE_HOMES + LAUNCHER_HOMES
            for i, line in enumerate(f.read_text().splitlines(), 1) if text.search(line)]
    assert hits == []


def test_name_comparison_check_finds_the_branches_it_forbids(tmp_path: Path) -> None:
    (tmp_path / "topology").mkdir()
    (tmp_path / "topology" / "x.py").write_text(
        'def f(topo, data, launcher):\n'
        '    if topo.engine == "sglang": pass\n'
        '    if topo.engine in ("embedded", "vllm"): pass\n'
        '    if "vllm" != self.engine: pass\n'
        '    if data.get("launcher") == "slurm": pass\n'
        '    if launcher not in ("ssh",): pass\n'
        '    if topo.transfer.backend == "mooncake": pass\n')
    assert name_comparisons(tmp_path, {"sglang", "vllm", "embedded"}, ("engine", "kind"), ENGINE_HOMES) == [
        "topology/x.py:2", "topology/x.py:3", "topology/x.py:4"]
    assert name_comparisons(tmp_path, {"local", "ssh", "slurm"}, ("launcher",), LAUNCHER_HOMES) == [
        "topology/x.py:5", "topology/x.py:6"]
