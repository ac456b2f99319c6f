"""How the preflight agent runs a tool and answers: every tool's output as {rc, out, err} (a
missing tool is rc 127, a hung one rc 124), and one JSON document per line on stdout."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from typing import Any


def emit(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def run_tool(argv: tuple[str, ...], timeout: float = 15.0) -> dict[str, Any]:
    if shutil.which(argv[0]) is None:
        return {"rc": 127, "out": "", "err": f"{argv[0]}: command not found"}
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"rc": 124, "out": "", "err": f"{' '.join(argv)} timed out after {timeout:g}s"}
    return {"rc": p.returncode, "out": p.stdout, "err": p.stderr}
