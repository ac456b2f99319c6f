"""`check`'s engine item: the release the topology names is the one installed where its workers
run. The engine's own interpreter (``engine.venv`` / ``engine.python``) is asked for its
distribution's version (``importlib.metadata``, no engine import: well under a second), on every
node that runs a worker; vLLM's CPU build reads ``0.32.0+cpu`` for the record 0.32.0."""

from __future__ import annotations

from typing import Mapping

from epdctl.engines import engine_of
from epdctl.preflight.records import CheckItem
from epdctl.preflight.runners import NodeRunner
from epdctl.topology.model import Topology

_CODE = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"


def engine_items(topo: Topology, runners: Mapping[str, NodeRunner]) -> list[CheckItem]:
    """One item per worker node; none when the topology names no engine interpreter."""
    eng = engine_of(topo)
    if not (topo.engine_venv or topo.engine_python) or not eng.package_keys:
        return []
    dist, py = eng.package_keys[0], topo.engine_interpreter
    what = f"{eng.name} {eng.version}"
    out = []
    for node in dict.fromkeys(n for w in topo.workers for n in w.nodes):
        runner = runners.get(node)
        if runner is None:
            continue
        try:
            res = runner.run([py, "-c", _CODE, dist], timeout=60)
        except Exception as e:  # noqa: BLE001 - an unreachable node is a finding, not a crash
            out.append(CheckItem(node, "engine", False, f"could not ask {py}: {e}"))
            continue
        got = res.stdout.strip()
        if res.rc != 0 or not got:
            err = (res.stderr.strip().splitlines() or ["no output"])[-1]
            out.append(CheckItem(node, "engine", False,
                                 f"{py} has no {dist} ({err}); install the engine there (this checkout: "
                                 f"bash scripts/setup_engines.sh) or fix engine.venv / engine.python"))
        elif got == eng.version or got.startswith(eng.version + "+"):
            out.append(CheckItem(node, "engine", True, f"{dist} {got} at {py}"))
        else:
            out.append(CheckItem(node, "engine", False,
                                 f"{py} has {dist} {got}; the topology names {what}: set engine.version or "
                                 f"point engine.venv at the {eng.version} install"))
    return out
