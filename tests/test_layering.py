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
