"""Weights where the engines read them: an ``hf:`` model downloaded once into the shared cache
(``hub``), and with ``model.stage`` copied to every node's own disk, checked by a manifest
(``manifest``, ``nodes``; the node side is ``epdctl/node/stage_agent.py``).

Everything here yields events (``events``) or raises ``StageError``; `epdctl stage` and `up`
print them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from epdctl.errors import StageError
from epdctl.stage import manifest as manifests
from epdctl.stage import nodes as node_copy
from epdctl.stage.events import Downloading, Event, Manifested
from epdctl.stage.hub import download
from epdctl.topology.model import Topology

MANIFEST_FILE = "weights-manifest.json"
STAGED_MARK = ".epdctl-manifest.json"  # a node's verified copy: written last (epdctl/node/stage_agent.py)

__all__ = ["MANIFEST_FILE", "STAGED_MARK", "download_model", "require_staged_here", "stage_nodes",
           "staging_nodes"]


def download_model(topo: Topology) -> Iterator[Event]:
    """``hf:`` models: fetch what the shared cache lacks, here (the login or control node)."""
    m = topo.model
    if m.hub is None or m.cache is None:
        return
    yield Downloading(f"hf:{m.hub}", m.cache)
    yield download(m.hub, m.cache)


def staging_nodes(topo: Topology, launcher: Any) -> list[str]:
    """The nodes that run workers, in topology order (one, when every node is this machine)."""
    used = {n for w in topo.workers for n in w.nodes}
    names = [n.name for n in topo.nodes if n.name in used]
    return names[:1] if getattr(launcher, "runs_here", False) else names


def stage_nodes(topo: Topology, launcher: Any, run_dir: Path) -> Iterator[Event]:
    """``model.stage``: the manifest (written once, in the run folder), then every node's room
    checked, then every node's copy made and verified, all nodes at once."""
    m = topo.model
    if m.stage is None:
        return
    path = run_dir / MANIFEST_FILE
    man, reused = manifests.build(m.origin, manifests.load(path))
    if not reused:
        manifests.write(man, path)
    yield Manifested(str(path), len(man.files), man.bytes, man.digest, reused)
    jobs = launcher.node_jobs(staging_nodes(topo, launcher))
    yield from node_copy.check_space(jobs, man, m.stage)
    yield from node_copy.copy(jobs, man, m.stage)


def require_staged_here(topo: Topology, topology: Path) -> None:
    """`up --no-stage` on this machine: ``model.stage`` must hold the verified copy `epdctl stage`
    leaves (on other nodes the preflight checks the model path on each)."""
    stage = topo.model.stage
    if stage is None or (Path(stage) / STAGED_MARK).is_file():
        return
    raise StageError(f"--no-stage: model.stage {stage} holds no staged copy of {topo.model.source} (no "
                     f"{STAGED_MARK}, which a finished copy ends with); run `epdctl stage {topology}` first, "
                     f"or drop --no-stage so that `up` copies the weights")
