"""What an engine needs to render one worker process (one node rank)."""

from __future__ import annotations

from dataclasses import dataclass

from epdctl.topology.model import Nic, Node, Topology, Worker


@dataclass(frozen=True)
class WorkerContext:
    topo: Topology
    worker: Worker
    rank: int
    node: Node
    ports: dict[str, int]  # this rank's ports
    leader_ports: dict[str, int]  # rank 0's ports (dist-init lives there)
    bind: str
    encoder_urls: tuple[str, ...]
    leader_host: str

    @property
    def nnodes(self) -> int:
        return len(self.worker.nodes)

    def transfer_nics(self) -> tuple[Nic, ...]:
        """The NICs this worker moves KV/embeddings over: named ones, else every ib/roce NIC of the node."""
        names = self.worker.settings.nics if self.worker.settings.nics is not None else self.topo.transfer.nics
        if names is not None:
            return tuple(n for name in names for n in [self.node.nic(name)] if n is not None)
        return tuple(n for n in self.node.nics if n.kind in ("ib", "roce"))
