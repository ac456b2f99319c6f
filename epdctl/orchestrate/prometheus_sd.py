"""Prometheus file-based service discovery: where every worker's and the router's /metrics is.

``epdctl status --prometheus-sd FILE`` (or ``up --prometheus-sd FILE``) writes FILE in the
``file_sd_configs`` format and registers it in the cluster's run folder; from then on every command
that changes the cluster (``up`` adding workers, ``rebalance`` moving them, ``down``) rewrites it
when it ends (``kept_current``), so a Prometheus server pointed at FILE follows the cluster without
a restart. Writes are atomic
(temp file + rename), which Prometheus' file watcher expects.

One target group per process so each carries its own labels: ``cluster``, ``role``
(encoder/prefill/decode/colocated/router), ``worker`` and ``node``. Only the rank-0 process of a
multi-node worker serves HTTP, so followers are left out. The router's target is its
``--prometheus-host/--prometheus-port`` page, read from the command line it was started with.

A cluster with an API key serves its workers' ``/metrics`` only with ``Authorization: Bearer
KEY``. The file never carries the key (file_sd has no place for credentials, and the file is
world-readable): the scrape job does, with ``authorization: {credentials_file: FILE}``
(``key_hint`` says so when the file is written).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

from epdctl.errors import EpdctlError
from epdctl.state.store import ClusterDir, ClusterState, ProcessRecord

REGISTRY = "prometheus_sd.json"  # in the cluster's run folder: the SD files kept current
_ANY_ADDR = ("0.0.0.0", "::", "")


def _address(host: str, port: int | str) -> str:
    host = "127.0.0.1" if host in _ANY_ADDR else host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _target(p: ProcessRecord) -> str | None:
    if p.role == "router":
        port = p.prometheus_port
        return _address(p.prometheus_host or p.host, port) if port else None
    if not p.is_leader:
        return None
    u = urlsplit(p.url)
    return _address(u.hostname or p.host, u.port or p.port)


def targets(state: ClusterState | None) -> list[dict[str, Any]]:
    """The file_sd document for ``state`` (an empty list when the cluster is stopped)."""
    out: list[dict[str, Any]] = []
    for p in (state.processes if state is not None else []):
        t = _target(p)
        if t is not None:
            out.append({"targets": [t], "labels": {"cluster": state.name, "role": p.role,  # type: ignore[union-attr]
                                                   "worker": p.name, "node": p.node}})
    return out


def write(path: Path, state: ClusterState | None) -> int:
    """Write the SD file atomically; returns the number of targets. EpdctlError if unwritable."""
    doc = targets(state)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        raise EpdctlError(f"cannot write Prometheus targets to {path} ({e.strerror}); check the path") from None
    return len(doc)


def key_hint(state: ClusterState | None) -> str | None:
    """How to scrape a keyed cluster: one line for the user, None when the cluster has no key."""
    if state is None or not state.api_key_env:
        return None
    return (f"the workers' /metrics need the cluster's API key: put the value of ${state.api_key_env} in a "
            "file only Prometheus can read and add `authorization: {type: Bearer, credentials_file: "
            "FILE}` to the scrape job (docs/limits.md)")


def registered(cdir: ClusterDir) -> list[Path]:
    """The SD files this cluster keeps current."""
    try:
        data = json.loads((cdir.root / REGISTRY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [Path(p) for p in data if isinstance(p, str)] if isinstance(data, list) else []


def register(cdir: ClusterDir, path: Path, state: ClusterState | None) -> int:
    """Write ``path`` now and keep it current from now on; returns the number of targets."""
    path = path.expanduser().resolve()
    n = write(path, state)
    paths = registered(cdir)
    if path not in paths:
        cdir.root.mkdir(parents=True, exist_ok=True)
        (cdir.root / REGISTRY).write_text(json.dumps([str(p) for p in paths + [path]]) + "\n", encoding="utf-8")
    return n


def refresh(cdir: ClusterDir) -> None:
    """Rewrite every registered SD file from the cluster's recorded state (no targets once it is
    forgotten); an unreadable state or a failing file is skipped, because monitoring must never
    stop a cluster from starting or stopping."""
    paths = registered(cdir)
    if not paths:
        return
    try:
        state = cdir.load()
    except EpdctlError:
        return
    for path in paths:
        try:
            write(path, state)
        except EpdctlError:
            continue


@contextlib.contextmanager
def kept_current(cdir: ClusterDir) -> Iterator[None]:
    """Run a block that changes the cluster's state, then ``refresh`` (also when the block failed)."""
    try:
        yield
    finally:
        refresh(cdir)
