"""What goes into a lock: epdctl's version; per node, what the preflight read (package versions
as the node reports them, GPUs, driver, RDMA ports); the container image where one is used;
the model's source, revision and file listing; every process's rendered command.

Secrets: commands and environments carry ``${VAR}`` references (render never writes a
secret's value); an environment value under a secret-looking name that is not such a reference
is replaced by ``<redacted>``, and the router's API key appears only as its variable's name.
"""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from epdctl import __version__
from epdctl.preflight.records import Facts
from epdctl.preflight.parsers import parse_nvidia_smi_csv
from epdctl.preflight.rdma_text import read_ibv_devinfo
from epdctl.preflight.targets import version_keys
from epdctl.orchestrate.startup import WEIGHT_SUFFIXES
from epdctl.render.plan import Plan
from epdctl.topology.model import Topology

LOCK_FORMAT = 1
RUN_KEYS = ("run",)   # informational: never compared
_SECRETISH = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL", re.I)
_REF = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*\}$")
_DRIVER = re.compile(r"Kernel Module(?: for [\w]+)?\s+([0-9][0-9.]+)")


def _env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (v if _REF.match(v) or not _SECRETISH.search(k) else "<redacted>")
            for k, v in sorted(env.items())}


def _process(p: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"node": p.node, "argv": list(p.argv)}
    if p.env:
        out["env"] = _env(p.env)
    if p.setup:
        out["setup"] = list(p.setup)
    if p.gpus:
        out["gpus"] = list(p.gpus)
    if getattr(p, "api_key_env", None):
        out["api_key_env"] = p.api_key_env
    return out


def model_listing(path: str) -> dict[str, Any]:
    """The weight and config files of a local model folder: count, bytes, and a hash over
    their names and sizes (``listing_sha256``); empty when the folder is not readable here."""
    folder = Path(path)
    try:
        files = sorted(f for f in folder.iterdir() if f.is_file() and (
            f.name.endswith(WEIGHT_SUFFIXES) or f.suffix == ".json"))
    except OSError:
        return {}
    h = hashlib.sha256()
    total = 0
    for f in files:
        size = f.stat().st_size
        total += size
        h.update(f"{f.name}\t{size}\n".encode())
    return {"files": len(files), "bytes": total, "listing_sha256": h.hexdigest()}


def _model(topo: Topology, manifest_sha256: str | None) -> dict[str, Any]:
    """Where the weights come from (``hf:ORG/NAME@REV`` or the folder), the revision asked for,
    the staged copy's manifest digest, and the served folder's listing."""
    m = topo.model
    out: dict[str, Any] = {"source": m.source, "served_name": m.served_name,
                           "revision": m.hub.revision if m.hub is not None else None,
                           "manifest_sha256": manifest_sha256}
    out.update(model_listing(m.path))
    return out


def _container(plan: Plan, images: Mapping[str, Mapping[str, str]] | None) -> dict[str, Any] | None:
    """The images the workers run (a ``container:`` block) and, per node, each image's id as the
    preflight found it there (``image_digest``; None when the preflight did not run)."""
    refs = sorted({w.container.image for w in plan.workers if w.container is not None})
    if not refs:
        return None
    return {"images": refs,
            "image_digest": None if images is None else {n: dict(sorted(v.items())) for n, v in sorted(images.items())}}


def node_facts(f: Facts, keys: Iterable[str]) -> dict[str, Any]:
    """One node as its preflight saw it: package versions, GPUs, driver, RDMA ports."""
    out: dict[str, Any] = {"versions": {k: f.versions.get(k) for k in keys}}
    gpus: list[str] = []
    text = f.out("nvidia_smi")
    if text:
        try:
            gpus = [f"{g.index}: {g.name}" + (f" ({g.memory_mib} MiB)" if g.memory_mib else "")
                    for g in parse_nvidia_smi_csv(text)]
        except ValueError:
            gpus = []
    out["gpus"] = gpus
    drv = _DRIVER.search(f.out("nvidia_driver") or "")
    out["driver"] = drv.group(1) if drv else None
    ports = read_ibv_devinfo(f.text("ibv_devinfo") or "").ports if f.text("ibv_devinfo") else []
    out["nics"] = [{"device": p.device, "port": p.port, "link_layer": p.link_layer or None,
                    "state": p.state, "rate_gbps": p.rate_gbps} for p in ports]
    return out


def build_lock(topo: Topology, plan: Plan, facts: Iterable[Facts] | None,
               manifest_sha256: str | None = None,
               images: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, Any]:
    """The lock of ``plan`` (as render made it) on nodes described by ``facts`` (None: the
    preflight did not run, e.g. --skip-preflight or a SLURM allocation not yet made)."""
    procs = [*plan.workers, *([plan.router] if plan.router is not None else [])]
    keys = version_keys(topo)
    nodes: dict[str, Any] | None = None
    if facts is not None:
        nodes = {f.node: node_facts(f, keys) for f in sorted(facts, key=lambda f: f.node)}
    return {
        "lock_format": LOCK_FORMAT,
        "epdctl": {"version": __version__},
        "engine": {"name": topo.engine,
                   "versions": None if nodes is None else {
                       n: {k: v for k, v in d["versions"].items() if k not in ("python", "epdctl")}
                       for n, d in nodes.items()}},
        "container": _container(plan, images if facts is not None else None),
        "model": _model(topo, manifest_sha256),
        "router": {"api_key_env": plan.router.api_key_env} if plan.router is not None else None,
        "processes": {p.name: _process(p) for p in procs},
        "nodes": nodes,
        "run": {"cluster": topo.name, "topology": str(topo.source) if topo.source else None,
                "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
    }
