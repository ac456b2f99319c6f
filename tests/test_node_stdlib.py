"""The programs in epdctl/node/ run on the nodes with the node's bare Python: they import only the
standard library and each other. How they are shipped: the ssh agent goes as one script
(``ssh_agent_procs`` pasted in front of ``ssh_agent``), the supervisor as its own source, and
`init` sends the preflight agent with the node modules it imports inlined; `check` runs it as
``python -m epdctl.node.preflight_agent`` where epdctl is installed.

Two deliberate exceptions, both inside a function: the link probes import the transport they
measure (pyzmq, Mooncake), present wherever workers run; the ssh agent imports ``epdctl`` itself
only to report which version would run the workers.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

NODE = Path(__file__).resolve().parents[1] / "epdctl" / "node"
LAZY_ALLOWED = {"zmq", "mooncake", "mooncake.engine", "epdctl"}


def _imports(tree: ast.AST) -> list[tuple[str, bool]]:
    """(module, inside a function) for every import; relative imports are ``epdctl.node``'s own."""
    out: list[tuple[str, bool]] = []

    def walk(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((a.name, inner) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                out.append(("epdctl.node" if child.level else child.module or "", inner))
            walk(child, inner)
    walk(tree, False)
    return out


def test_node_programs_import_only_the_standard_library() -> None:
    files = sorted(NODE.glob("*.py"))
    assert {f.stem for f in files} >= {"ssh_agent", "ssh_agent_procs", "supervise", "preflight_agent",
                                       "preflight_links", "sysfs_rdma"}
    bad = []
    for f in files:
        for name, lazy in _imports(ast.parse(f.read_text(), filename=str(f))):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or name == "__future__" or name.startswith("epdctl.node"):
                continue
            if lazy and name in LAZY_ALLOWED:
                continue
            bad.append(f"{f.name} imports {name}" + (" (in a function)" if lazy else ""))
    assert not bad, "\n".join(bad)


def test_the_shipped_scripts_run_on_a_bare_python(tmp_path: Path) -> None:
    """What goes to a node runs with ``python -I`` from an empty folder (no epdctl importable)."""
    from epdctl.init.reach import AGENT_SOURCE
    from epdctl.launchers.ssh.starting import SUPERVISOR_SOURCE
    from epdctl.node.ssh_agent import node_source

    for name, src in (("preflight agent", AGENT_SOURCE), ("ssh agent", node_source()),
                      ("supervisor", SUPERVISOR_SOURCE)):
        code = f"import sys; sys.argv = ['x', '--help']\ntry:\n    exec(compile({src!r}, 'p', 'exec'), {{'__name__': 'shipped'}})\nexcept SystemExit:\n    pass\nimport epdctl"
        proc = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path)
        assert "No module named 'epdctl'" in proc.stderr, f"{name}: {proc.stderr[-800:]}"
