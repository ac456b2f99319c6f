"""The containers a launcher's processes run in: removed by name after their processes stop (a
runtime client killed with SIGKILL leaves its container running), found by the cluster's (and
node's) label when the state is damaged or gone (`down`'s search for unrecorded processes), and
their image's id asked on the node once they started (`status`).

The commands come from the runtime records (epdctl/containers/); this module only decides which
to run for which records and reads their answers. The local launcher runs them here
(``run_here``), the ssh launcher through each node's agent (its ``run`` op)."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any, Mapping, Sequence

from epdctl.containers.registry import RUNTIMES, runtime_for
from epdctl.containers.spec import Container
from epdctl.errors import LaunchError
from epdctl.state.store import ProcessRecord

TIMEOUT_S = 60.0
Command = tuple[str, ...]


def container_of(rec: ProcessRecord) -> Container | None:
    c = rec.container
    if not c or c.get("runtime") not in {r.name for r in RUNTIMES}:
        return None
    return Container(image=str(c.get("image", "")), runtime=str(c["runtime"]),
                     options=tuple(str(o) for o in c.get("options", ())))


def removal(rec: ProcessRecord) -> Command | None:
    """The command removing ``rec``'s container, running or not (None: it has none to remove)."""
    c = container_of(rec)
    name = str(rec.container.get("name", "")) if c is not None else ""
    return runtime_for(c.runtime).remove(c, (name,)) if c is not None and name else None


def removal_failure(rec: ProcessRecord, argv: Command, rc: int, err: str) -> LaunchError | None:
    """What a removal's exit means: None when the container is gone (removed, or never was)."""
    if rc == 0 or "no such container" in err.lower() or rc == 127:  # 127: no such runtime here
        return None
    return LaunchError(f"[{rec.node}/{rec.name}] cannot remove container {argv[-1]} ({' '.join(argv[:1])}): "
                       f"{err.strip()[:300]}")


def searches(cluster: str, node: str | None, options: Mapping[str, Sequence[str]] | None = None
             ) -> list[tuple[str, Command]]:
    """(runtime, command) listing the containers labelled with ``cluster`` (and ``node``), for
    every runtime whose containers outlive their process; ``options``: the runtime program's own
    options by runtime (the storage the cluster used), default storage otherwise."""
    out = []
    for runtime in RUNTIMES:
        c = Container(image="", runtime=runtime.name, options=tuple((options or {}).get(runtime.name, ())))
        argv = runtime.find(c, cluster, node)
        if argv is not None:
            out.append((runtime.name, argv))
    return out


def found(runtime: str, stdout: str, node: str, options: Sequence[str] = ()) -> list[ProcessRecord]:
    """Records of the containers a search printed (one name a line)."""
    return [ProcessRecord(name=f"container {name}", role="unknown", node=node,
                          container={"runtime": runtime, "name": name, "options": list(options)})
            for name in stdout.split()]


def digest_command(rec: ProcessRecord) -> Command | None:
    """The command printing the id of the image ``rec`` runs (None: the runtime cannot say)."""
    c = container_of(rec)
    return runtime_for(c.runtime).image_digest(c) if c is not None and c.image else None


def run_here(argv: Command) -> tuple[int, str, str]:
    """Run one command on this machine: (status, stdout, stderr); 127 when it is not installed."""
    if not shutil.which(argv[0]):
        return 127, "", f"{argv[0]}: command not found"
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 124, "", str(e)
    return proc.returncode, proc.stdout, proc.stderr


def remove(recs: Sequence[ProcessRecord]) -> dict[str, LaunchError]:
    """Remove the containers of ``recs`` on this machine; failures by record name."""
    failed: dict[str, LaunchError] = {}
    for rec in recs:
        argv = removal(rec)
        if argv is None:
            continue
        rc, _, err = run_here(argv)
        why = removal_failure(rec, argv, rc, err)
        if why is not None:
            failed[rec.name] = why
    return failed


def labelled(cluster: str, node: str) -> list[ProcessRecord]:
    """Containers labelled with ``cluster`` by every docker/podman on this machine (default storage)."""
    out: list[ProcessRecord] = []
    for runtime, argv in searches(cluster, None):
        rc, stdout, _ = run_here(argv)
        if rc == 0:  # else no daemon (docker) or no storage: nothing of this runtime to find
            out += found(runtime, stdout, node)
    return out


def record_digests(recs: Sequence[ProcessRecord], runners: Mapping[str, Any]) -> None:
    """Ask each node once per image for the id of the image its containers run; kept in the
    records' ``container["digest"]`` (`status`). ``runners``: node -> NodeRunner. A node that
    cannot say leaves it unset."""
    asked: dict[tuple[str, Command], str | None] = {}
    for rec in recs:
        argv = digest_command(rec)
        if argv is None or rec.node not in runners:
            continue
        key = (rec.node, argv)
        if key not in asked:
            try:
                res = runners[rec.node].run(list(argv), timeout=TIMEOUT_S)
                asked[key] = res.stdout.strip().splitlines()[-1] if res.rc == 0 and res.stdout.strip() else None
            except Exception:  # noqa: BLE001 - the id is shown when known, never a reason to fail `up`
                asked[key] = None
        if asked[key]:
            rec.container["digest"] = asked[key]
