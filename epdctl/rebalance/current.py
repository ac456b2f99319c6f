"""The live layout of a recorded cluster: its topology file plus the moves applied since `up`."""

from __future__ import annotations

from pathlib import Path

from epdctl.errors import StateError
from epdctl.rebalance import history
from epdctl.rebalance.plan import replay
from epdctl.state.store import ClusterDir, ClusterState
from epdctl.topology import load_topology
from epdctl.topology.model import Topology


def current_topology(cdir: ClusterDir, state: ClusterState) -> Topology:
    """Load the cluster's topology file and replay its successful rebalances."""
    path = Path(state.topology)
    if not path.is_file():
        raise StateError(f"cluster {state.name!r} was started from {path}, which no longer "
                         f"exists; restore it to rebalance this cluster")
    topo = load_topology(path)
    return replay(topo, history.applied_moves(history.read(cdir.root), since=state.created))
