"""A worker's process spec inside its container: the anchors' defaults filled in (host network
and IPC, ``memlock=-1``, the worker's GPUs, ``/dev/infiniband`` and IPC_LOCK where it uses ib/roce
NICs, the model's HF repository root and the engine interpreter's venv mounted at their own paths,
the transfer's store directories writable), then
the runtime's record writes the command. Pure: the same topology gives the same command."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from epdctl.containers.base import LABEL_NODE, LABEL_PROCESS, Run
from epdctl.containers.registry import runtime_for
from epdctl.topology.container import IB_DEVICE, rdma_nics
from epdctl.topology.model import Container, Mount, Topology, Worker

HF_SNAPSHOT = re.compile(r"^(?P<repo>/.*/models--[^/]+)/snapshots/[^/]+/?$")
# markers the launchers set (epdctl/launchers/base.py): inside too, so `down` finds the processes
MARKERS = ("EPDCTL_CLUSTER", "EPDCTL_WORKER", "EPDCTL_TOKEN", "PYTHONUNBUFFERED")
_NAME = re.compile(r"[^a-zA-Z0-9_.-]+")


def container_name(cluster: str, process: str) -> str:
    """epdctl-<cluster>-<process>: what `down` removes by name; [a-zA-Z0-9_.-] only."""
    return _NAME.sub("-", f"epdctl-{cluster}-{process}")


def model_mount(path: str) -> str | None:
    """What to mount for the model: an HF snapshot's repository root (the snapshot's files are
    symlinks into ../../blobs), else the model directory; None for a hub id."""
    m = HF_SNAPSHOT.match(path)
    if m:
        return m.group("repo")
    return (path.rstrip("/") or "/") if path.startswith("/") else None


def interpreter_mounts(python: str) -> list[str]:
    """An absolute interpreter in a venv runs inside when the venv and its base interpreter's
    prefix are at the same paths there (pyvenv.cfg ``home``)."""
    if not python.startswith("/"):
        return []
    root = Path(python).parent.parent
    cfg = root / "pyvenv.cfg"
    try:
        lines = cfg.read_text().splitlines()
    except OSError:
        return [str(Path(python).parent.parent)]
    home = next((ln.split("=", 1)[1].strip() for ln in lines if ln.split("=", 1)[0].strip() == "home"), None)
    return [str(root)] + ([str(Path(home).parent)] if home else [])


def _covered(path: str, mounts: tuple[Mount, ...], writable: bool = False) -> bool:
    """A mount at its own path already holds ``path`` (a writable one, with ``writable``)."""
    return any(m.source == m.target and (path == m.source or path.startswith(m.source.rstrip("/") + "/"))
               and not (writable and m.readonly) for m in mounts)


def effective(topo: Topology, w: Worker, node: str, c: Container,
              stores: tuple[str, ...] = ()) -> Container:
    """``c`` with the anchors' defaults for this worker on ``node``: read-only, the model and the
    engine's interpreter (its venv and base prefix); writable, the transfer's ``stores``."""
    runtime = runtime_for(c.runtime)
    mounts = c.mounts
    wanted = [p for p in [model_mount(topo.model.path), *interpreter_mounts(topo.engine_interpreter)] if p]
    for p in wanted:
        if not _covered(p, mounts):
            mounts = (*mounts, Mount(source=p, target=p, readonly=True))
    for p in stores:
        if not _covered(p, mounts, writable=True):
            mounts = (*mounts, Mount(source=p, target=p, readonly=False))
    rdma = bool(rdma_nics(topo, w, node)) and topo.transfer.rdma != "off"
    env, ulimits, cap_add = dict(c.env), dict(c.ulimits), c.cap_add
    devices = c.devices if c.devices is not None else ((IB_DEVICE,) if rdma and not runtime.step else ())
    if not runtime.step:
        ulimits.setdefault("memlock", "-1")
        if rdma and not c.privileged and "IPC_LOCK" not in cap_add:
            cap_add = (*cap_add, "IPC_LOCK")
    elif rdma:
        env.setdefault("MELLANOX_VISIBLE_DEVICES", "all")  # enroot's mellanox hook
    return dataclasses.replace(c, mounts=mounts, env=env, ulimits=ulimits, devices=devices, cap_add=cap_add)


def wrapped(topo: Topology, w: Worker, node: str, process: str, argv: tuple[str, ...], env_names: tuple[str, ...],
            gpus: tuple[int, ...], stores: tuple[str, ...] = ()) -> tuple[Container, str, tuple[str, ...], tuple[str, ...]]:
    """(the effective container, its name, the command that runs, the srun step options)."""
    assert w.settings.container is not None
    c = effective(topo, w, node, w.settings.container, stores)
    name = container_name(topo.name, process)
    run = Run(name=name, cluster=topo.name, process=process,
              env_names=tuple(dict.fromkeys([*env_names, *MARKERS])), gpus=gpus,
              rdma=bool(rdma_nics(topo, w, node)), labels={LABEL_NODE: node, LABEL_PROCESS: process})
    runtime = runtime_for(c.runtime)
    if runtime.step:
        return c, name, argv, runtime.step_options(c, run)
    return c, name, runtime.command(c, run, argv), ()
