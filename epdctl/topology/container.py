"""``container:`` blocks: read one layer (top level, ``defaults``, a role, a node's defaults, a
worker), merge the layers, and check the result against its runtime and the nodes' NICs.

Layering follows the other settings: ``env`` and ``ulimits`` merge key by key, ``mounts``,
``devices``, ``cap_add`` and ``args`` add up, every other key is replaced by the more specific
layer; ``container: false`` runs the workers below it bare."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

from epdctl.containers.registry import RUNTIME_NAMES, runtime_for
from epdctl.launchers.kinds import LAUNCHER_NAMES, launcher_kind
from epdctl.topology.loader import join
from epdctl.topology.model import Container, Mount, Topology, Worker
from epdctl.topology.reader import Reader

KEYS = ("image", "runtime", "mounts", "env", "devices", "gpus", "shm_size", "ulimits", "network", "ipc",
        "privileged", "cap_add", "options", "args", "workdir")
ULIMITS = ("core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc", "rss", "rtprio",
           "rttime", "sigpending", "stack")
SIZE = re.compile(r"^[0-9]+(\.[0-9]+)?[bkmgBKMG]?$")
LIMIT = re.compile(r"^(-1|unlimited|[0-9]+)(:(-1|unlimited|[0-9]+))?$")
CAP = re.compile(r"^[A-Z_]+$")
ADDING = ("mounts", "devices", "cap_add", "args")
MERGING = ("env", "ulimits")
DEFAULT_RUNTIME = "docker"
IB_DEVICE = "/dev/infiniband"


def read_layer(r: Reader, value: Any, path: str) -> dict[str, Any]:
    """One ``container:`` block as the keys it sets (``{"off": True}`` for ``container: false``)."""
    if value is False:
        return {"off": True, "path": path}
    m = r.mapping(value, path, KEYS, "container")
    if m is None:
        return {}
    out: dict[str, Any] = {"path": path}
    for key in ("image", "shm_size", "workdir"):
        if m.get(key) is not None:
            out[key] = r.get(m, path, key, "str")
    if isinstance(out.get("image"), str):
        out["image"] = _from_file(out["image"], r.doc.source)
    if m.get("runtime") is not None:
        out["runtime"] = r.get(m, path, "runtime", "str", choices=RUNTIME_NAMES)
    if m.get("gpus") is not None:
        out["gpus"] = r.get(m, path, "gpus", "str", choices=("auto", "all", "none"))
    if m.get("network") is not None:
        out["network"] = r.get(m, path, "network", "str", choices=("host",))
    if m.get("ipc") is not None:
        out["ipc"] = r.get(m, path, "ipc", "str", choices=("host", "private", "shareable"))
    if m.get("privileged") is not None:
        out["privileged"] = r.get(m, path, "privileged", "bool")
    if "shm_size" in out and out["shm_size"] is not None and not SIZE.match(out["shm_size"]):
        r.problem(join(path, "shm_size"), f"shm_size {out['shm_size']!r} is not a size: write e.g. 32g or 512m")
    for key in ("devices", "cap_add", "options", "args"):
        if m.get(key) is not None:
            out[key] = r.get(m, path, key, "strlist", default=())
    for cap in out.get("cap_add", ()):
        if not CAP.match(cap):
            r.problem(join(path, "cap_add"), f"cap_add {cap!r} is not a capability name such as IPC_LOCK")
    if "env" in m:
        out["env"] = r.env(m, path)
    if m.get("ulimits") is not None:
        out["ulimits"] = _ulimits(r, m["ulimits"], join(path, "ulimits"))
    if m.get("mounts") is not None:
        out["mounts"] = _mounts(r, m["mounts"], join(path, "mounts"), r.doc.source)
    return {k: v for k, v in out.items() if v is not None}


def _ulimits(r: Reader, raw: Any, path: str) -> dict[str, str]:
    if not isinstance(raw, dict):
        r.problem(path, "ulimits must be a mapping NAME: LIMIT (memlock: -1, nofile: 65536:65536)")
        return {}
    out: dict[str, str] = {}
    for name, value in raw.items():
        text = str(value).strip()
        if name not in ULIMITS:
            r.problem(join(path, str(name)), f"unknown ulimit {name!r}; choose from: {', '.join(ULIMITS)}")
        elif isinstance(value, bool) or not LIMIT.match(text):
            r.problem(join(path, str(name)), f"ulimit {name} must be -1 (unlimited), N or SOFT:HARD, got {value!r}")
        else:
            out[name] = text
    return out


def _mounts(r: Reader, raw: Any, path: str, source: Path | None) -> tuple[Mount, ...]:
    if not isinstance(raw, list):
        r.problem(path, "mounts must be a list of SRC[:DST[:ro]] strings or {source, target, readonly} mappings")
        return ()
    out: list[Mount] = []
    for i, item in enumerate(raw):
        ipath = join(path, i)
        if isinstance(item, dict):
            m = r.mapping(item, ipath, ("source", "target", "readonly"), "a mount")
            if m is None:
                continue
            src, dst = r.get(m, ipath, "source", "str", required=True), r.get(m, ipath, "target", "str")
            ro = r.get(m, ipath, "readonly", "bool", default=False)
        elif isinstance(item, str) and item:
            parts = item.split(":")
            if len(parts) > 3 or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
                r.problem(ipath, f"mount {item!r} is not SRC[:DST[:ro|rw]]")
                continue
            src, dst, ro = parts[0], parts[1] if len(parts) > 1 and parts[1] else None, parts[2:] == ["ro"]
        else:
            r.problem(ipath, "a mount is SRC[:DST[:ro]] or {source, target, readonly}")
            continue
        if src is None:
            continue
        src = _from_file(src, source)
        if not src.startswith("/"):
            r.problem(ipath, f"mount source {src!r} must be an absolute path (or ./, ../ from the topology file)")
            continue
        if dst is not None and not dst.startswith("/"):
            r.problem(ipath, f"mount target {dst!r} must be an absolute path inside the container")
            continue
        out.append(Mount(source=src, target=dst or src, readonly=bool(ro)))
    return tuple(out)


def _from_file(path: str, source: Path | None) -> str:
    """A ./ or ../ path (a mount source, an image file or bundle) from the topology file's folder."""
    if source is not None and (path.startswith(("./", "../")) or path in (".", "..")):
        try:
            return str((source.resolve().parent / path).resolve())
        except ValueError:  # a NUL in it: left as written, for the checks to refuse
            return path
    return path


def merge(layers: list[dict[str, Any]]) -> Container | None:
    """The container the layers describe, lowest first (None: the worker runs bare)."""
    merged: dict[str, Any] = {}
    for layer in layers:
        if layer.get("off"):
            merged = {}
            continue
        for key, value in layer.items():
            if key in ADDING:
                merged[key] = (*merged.get(key, ()), *value)
            elif key in MERGING:
                merged[key] = {**merged.get(key, {}), **value}
            else:
                merged[key] = value
    if set(merged) <= {"path"}:
        return None
    merged.setdefault("image", "")
    merged.setdefault("runtime", DEFAULT_RUNTIME)
    if "devices" not in merged:
        merged["devices"] = None
    return Container(**merged)


def rdma_nics(topo: Topology, w: Worker, node: str) -> list[str]:
    """The ib/roce NICs the worker uses on ``node`` (its nics, else the transfer's, else all)."""
    n = topo.node(node)
    wanted = w.settings.nics or topo.transfer.nics
    return [nic.name for nic in n.nics if nic.kind in ("ib", "roce") and (wanted is None or nic.name in wanted)]


def container_problems(topo: Topology) -> Iterator[tuple[str, str]]:
    """Image references, runtimes against the launcher, RDMA devices against the NICs."""
    seen: set[tuple[str, str]] = set()
    for w in topo.workers:
        c = w.settings.container
        if c is None:
            continue
        where = c.path or w.path
        problems: list[tuple[str, str]] = []
        if not c.image:
            problems.append((where, f"{w.name}: the container has no image; set container.image"))
        else:
            why = runtime_for(c.runtime).image_problem(c.image)
            if why:
                problems.append((join(where, "image"), why))
        runtime = runtime_for(c.runtime)
        steps = topo.launcher in LAUNCHER_NAMES and launcher_kind(topo.launcher).job_steps
        if runtime.step and not steps:
            problems.append((join(where, "runtime"), f"{c.runtime} runs each worker as a SLURM job step (srun "
                                                     f"--container...): set launcher: slurm, or use docker, "
                                                     f"podman or apptainer with the {topo.launcher} launcher"))
        rdma = rdma_nics(topo, w, w.nodes[0])
        if rdma and not c.privileged and topo.transfer.rdma != "off":
            if runtime.step and c.env.get("MELLANOX_VISIBLE_DEVICES", "all") in ("none", "void", ""):
                problems.append((join(where, "env"), (
                    f"{w.name} uses RDMA NICs {', '.join(rdma)} but MELLANOX_VISIBLE_DEVICES hides them from the "
                    f"container: Mooncake/NCCL would fall back to TCP; drop it or set it to all")))
            elif not runtime.step and c.devices is not None and IB_DEVICE not in c.devices:
                problems.append((join(where, "devices"), (
                    f"{w.name} uses RDMA NICs {', '.join(rdma)} on node {w.nodes[0]} but the container gets no "
                    f"{IB_DEVICE}: Mooncake/NCCL would fall back to TCP; add {IB_DEVICE} to container.devices "
                    f"(with cap_add: [IPC_LOCK]), or set privileged: true")))
        for p in problems:
            if p not in seen:
                seen.add(p)
                yield p


def missing_artifacts(topo: Topology) -> list[tuple[str, str]]:
    """Container artefacts that must exist where this command runs before anything starts (an OCI
    bundle that SLURM's ``--container`` reads from the shared filesystem): (YAML path, message).
    `validate` and `up` ask; `render` does not, so a topology renders on a machine without them."""
    out: dict[tuple[str, str], None] = {}
    for w in topo.workers:
        c = w.settings.container
        if c is None or not c.image or runtime_for(c.runtime).image_problem(c.image):
            continue
        why = runtime_for(c.runtime).missing(c)
        if why:
            out[(join(c.path or w.path, "image"), why)] = None
    return list(out)
