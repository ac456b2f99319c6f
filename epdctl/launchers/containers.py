"""The containers a launcher's processes run in, on this machine: removed by name after their
processes stop (a runtime client killed with SIGKILL leaves its container running), and found by
the cluster's label when the state is damaged or gone (`down`'s search for unrecorded processes)."""

from __future__ import annotations

import shutil
import subprocess
from typing import Sequence

from epdctl.containers.registry import RUNTIMES, runtime_for
from epdctl.containers.spec import Container
from epdctl.errors import LaunchError
from epdctl.state.store import ProcessRecord

TIMEOUT_S = 60.0


def _container(rec: ProcessRecord) -> Container | None:
    c = rec.container
    if not c or c.get("runtime") not in {r.name for r in RUNTIMES}:
        return None
    return Container(image=str(c.get("image", "")), runtime=str(c["runtime"]),
                     options=tuple(str(o) for o in c.get("options", ())))


def remove(recs: Sequence[ProcessRecord]) -> dict[str, LaunchError]:
    """Remove the containers of ``recs`` (running or not); failures by record name."""
    failed: dict[str, LaunchError] = {}
    for rec in recs:
        c = _container(rec)
        name = str(rec.container.get("name", "")) if c is not None else ""
        argv = runtime_for(c.runtime).remove(c, (name,)) if c is not None and name else None
        if argv is None or not shutil.which(argv[0]):
            continue
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            failed[rec.name] = LaunchError(f"[{rec.node}/{rec.name}] {' '.join(argv[:2])} rm {name}: {e}")
            continue
        if proc.returncode != 0 and "no such container" not in proc.stderr.lower():
            failed[rec.name] = LaunchError(f"[{rec.node}/{rec.name}] cannot remove container {name}: "
                                           f"{proc.stderr.strip()[:300]}")
    return failed


def labelled(cluster: str, node: str) -> list[ProcessRecord]:
    """Containers labelled with ``cluster`` by every docker/podman on this machine (default storage)."""
    out: list[ProcessRecord] = []
    for runtime in RUNTIMES:
        c = Container(image="", runtime=runtime.name)
        argv = runtime.find(c, cluster)
        if argv is None or not shutil.which(argv[0]):
            continue
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            continue  # no daemon (docker) or no storage: nothing of this runtime to find
        if proc.returncode != 0:
            continue
        for name in proc.stdout.split():
            out.append(ProcessRecord(name=f"container {name}", role="unknown", node=node,
                                     container={"runtime": runtime.name, "name": name, "options": []}))
    return out
