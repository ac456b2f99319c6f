"""`check`'s transfer-store item: on every node whose workers move data through files
(``Engine.store_dirs``: vLLM's example connectors under ``transfer.backend: shared-storage``),
the store directory can be made there and has room, on the storage the topology says: a
filesystem the nodes share (``shared: true`` on each) or the node's own disk. One short stdlib
program per node, through the same runner as the other checks; nothing is created."""

from __future__ import annotations

import json
from typing import Mapping

from epdctl.engines import engine_of
from epdctl.preflight.records import CheckItem
from epdctl.preflight.runners import NodeRunner
from epdctl.topology.model import Topology

# argv: DIR...; prints one JSON line per DIR: where it would be made and what that place offers
_CODE = """
import json, os, sys
for d in sys.argv[1:]:
    base = d
    while not os.path.exists(base):
        base = os.path.dirname(base)
    st = os.statvfs(base)
    print(json.dumps({"dir": d, "exists": os.path.isdir(d), "base": base,
                      "writable": os.access(base, os.W_OK | os.X_OK),
                      "free_gb": st.f_bavail * st.f_frsize / 2**30}))
"""


def store_items(topo: Topology, runners: Mapping[str, NodeRunner], min_free_gb: float = 1.0) -> list[CheckItem]:
    """One item per worker node; none when the engine moves no data through files."""
    dirs = engine_of(topo).store_dirs(topo)
    if not dirs:
        return []
    nodes = list(dict.fromkeys(n for w in topo.workers for n in w.nodes))
    shared = len(nodes) > 1 and all(topo.node(n).shared for n in nodes)
    where = f"storage shared by {', '.join(nodes)}" if shared else "this node's own disk"
    out = []
    for node in nodes:
        runner = runners.get(node)
        if runner is None:
            continue
        try:
            res = runner.run([runner.python, "-c", _CODE, *dirs], timeout=60)
            found = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
        except Exception as e:  # noqa: BLE001 - an unreachable node is a finding, not a crash
            out.append(CheckItem(node, "transfer store", False, f"could not look at {' '.join(dirs)}: {e}"))
            continue
        if res.rc != 0 or len(found) != len(dirs):
            err = (res.stderr.strip().splitlines() or ["no output"])[-1]
            out.append(CheckItem(node, "transfer store", False, f"could not look at {' '.join(dirs)}: {err}"))
            continue
        bad = [f"{f['dir']}: {f['base']} is not writable" for f in found if not f["writable"]]
        bad += [f"{f['dir']}: {f['free_gb']:.1f} GiB free on {f['base']}, below {min_free_gb:g} GiB"
                for f in found if f["writable"] and f["free_gb"] < min_free_gb]
        if bad:
            out.append(CheckItem(node, "transfer store", False,
                                 "; ".join(bad) + " (`up` empties it, the workers write embeddings and KV "
                                 "there): set transfer.store to a writable directory with room"))
            continue
        detail = "; ".join(f"{f['dir']} ({'there, `up` empties it' if f['exists'] else 'made by `up`'}) "
                           f"on {where}, {f['free_gb']:.1f} GiB free" for f in found)
        out.append(CheckItem(node, "transfer store", True, detail))
    return out
