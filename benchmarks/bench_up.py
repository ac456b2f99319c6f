"""`up` time against the slowest worker's own ready time, all roles at once vs role by role.

For each launcher (local; ssh over real sshd nodes on 127.0.0.2-4) and each order, one run of
`up`'s own ``BringUp`` over topologies/local.yaml's cluster (2 encoders, 1 prefill, 1 decode,
the smg router; embedded engine, real torch workers) measures, side by side in the same run:

* ``up_s``: from the first start to the router ready (what `epdctl up` waits for);
* ``slowest_worker_s``: the largest "started -> first healthy /health" of any worker, i.e. how
  long the slowest worker alone takes to load; ``up_s / slowest_worker_s`` is the overhead of
  the bring-up order (the goal for all-at-once: <= 1.2).

"sequential" starts the roles one by one: start a role, wait for it, then the next role,
then the router (same launcher calls, same health probes). Short runs: ``--repeat 1`` is what
the docs quote. Prints JSON and writes benchmarks/results/up.json.

    flock /tmp/epdctl-heavy.lock .venv/bin/python benchmarks/bench_up.py --repeat 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from sshd_nodes import SshdNodes  # noqa: E402

from epdctl.launchers import get_launcher  # noqa: E402
from epdctl.orchestrate.lifecycle import ROLE_ORDER, BringUp, records_of, tear_down  # noqa: E402
from epdctl.render import build_plan  # noqa: E402
from epdctl.state.store import ClusterDir, ClusterState  # noqa: E402
from epdctl.topology import load_topology  # noqa: E402

SSHD_PORT = 35026


def topology(tmp: Path, launcher: str, base: int, sshd: SshdNodes | None) -> Path:
    src = ROOT / "topologies" / "local.yaml"
    doc = yaml.safe_load(src.read_text())
    doc["name"] = f"bench-up-{launcher}"
    doc["model"]["path"] = str((src.parent / doc["model"]["path"]).resolve())
    doc["ports"] = {"base": base, "limit": base + 99}
    doc["launcher"] = launcher
    if sshd is not None:  # the same roles over three nodes, one sshd each
        doc["nodes"] = [{"name": n.name, "host": n.host, "shared": True,
                         "ssh": {"user": sshd.user, "port": sshd.port, "key": str(sshd.client_key)},
                         "setup": [f"export PATH={Path(sys.executable).parent}:$PATH"]}
                        for n in sshd.nodes]
        a, b, c = (n.name for n in sshd.nodes)
        doc["roles"] = {"encoder": {"nodes": [a], "count": 2}, "prefill": {"nodes": [b], "count": 1},
                        "decode": {"nodes": [c], "count": 1}}
        doc["router"] = {"node": a, "host": "node", "implementation": "smg"}
        doc["defaults"] = {"host": "node"}
    out = tmp / f"{doc['name']}.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def one_run(path: Path, order: str, state_root: Path) -> dict[str, float]:
    topo = load_topology(path)
    plan = build_plan(topo)
    cdir = ClusterDir(topo.name, state_root)
    state = ClusterState(name=topo.name, topology=str(path), launcher=topo.launcher,
                         engine=topo.engine, model=topo.model.served_name)
    cdir.save(state)
    launcher = get_launcher(topo.launcher, cdir.root, topo)
    bu = BringUp(launcher, cdir, state, timeout=600)
    t0 = time.monotonic()
    try:
        if order == "all-at-once":
            bu.run(plan)
        else:
            recs = records_of(plan, topo.engine, cdir)
            for stage in (*ROLE_ORDER, "router"):
                group = [r for r in recs if r.role == stage]
                if group:
                    bu.start(group)
                    bu.wait(group)
        up_s = time.monotonic() - t0
        own = {n: bu.ready_at[n] - bu.started_at[n] for n in bu.ready_at if n != "router"}
        return {"up_s": up_s, "slowest_worker_s": max(own.values()),
                "ratio": up_s / max(own.values())}
    finally:
        res, _ = tear_down(state, launcher)
        launcher.close()
        if not res.all_ok:
            sys.exit(f"could not stop the bench cluster: {res.failed}")
        cdir.clear()
        time.sleep(3)  # smg's metrics port is released a moment after it exits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--launchers", default="local,ssh")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "up.json")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="epd-bench-up-"))
    results: dict[str, dict[str, Any]] = {}
    for launcher in args.launchers.split(","):
        sshd = SshdNodes(tmp / "sshd", 3, port=SSHD_PORT) if launcher == "ssh" else None
        if sshd is not None:
            sshd.start()
            import os
            os.environ.update(EPDCTL_KNOWN_HOSTS=str(sshd.known_hosts), EPDCTL_SSH_CONFIG="",
                              EPDCTL_SSH_RUN_ROOT=str(tmp / "nodes"))
        try:
            path = topology(tmp, launcher, 39300, sshd)
            for order in ("all-at-once", "sequential"):
                runs = [one_run(path, order, tmp / "state") for _ in range(args.repeat)]
                results[f"{launcher} {order}"] = {
                    k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]}
                print(f"{launcher:5} {order:11} " + "  ".join(
                    f"{k} {v}" for k, v in results[f"{launcher} {order}"].items()), flush=True)
        finally:
            if sshd is not None:
                sshd.stop()
    doc = {"benchmark": "bench_up", "repeat": args.repeat, "results": results,
           "speedup_vs_sequential": {
               la: round(results[f"{la} sequential"]["up_s"] / results[f"{la} all-at-once"]["up_s"], 2)
               for la in args.launchers.split(",")}}
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
