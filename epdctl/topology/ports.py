"""Deterministic port plan: explicit ports first, then per-node counters from the node's base.

Every listening port a worker or the router needs is named here, so collisions are caught at
validate time (srt-slurm lesson: no engine-chosen defaults such as 8998 shared by two prefills).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from epdctl.engines.registry import engine_of
from epdctl.topology.model import Router, Topology, Worker


@dataclass
class PortPlan:
    """``workers[(name, rank)]`` -> label -> port; ``router`` -> label -> port; ``problems`` (path, message)."""

    workers: dict[tuple[str, int], dict[str, int]] = field(default_factory=dict)
    router: dict[str, int] = field(default_factory=dict)
    problems: list[tuple[str, str]] = field(default_factory=list)


LATE = ("transfer",)  # allocated after every other port, so adding them moved no existing port


def _explicit(w: Worker, label: str) -> int | None:
    return {"http": w.port, "bootstrap": w.bootstrap_port, "encoder_bootstrap": w.encoder_bootstrap_port,
            "dist_init": w.dist_init_port, "transfer": w.transfer_port}.get(label)


def plan_ports(topo: Topology) -> PortPlan:
    """Assign every port; report collisions and exhausted ranges."""
    plan = PortPlan()
    engine = engine_of(topo)
    taken: dict[str, dict[int, str]] = {n.name: {} for n in topo.nodes}  # node -> port -> owner
    limit = topo.ports.limit or 65535

    def claim(node: str, port: int, size: int, owner: str, path: str) -> None:
        for p in range(port, port + size):
            if p in taken[node]:
                plan.problems.append((path, f"port {p} on node {node!r} is used twice: by {taken[node][p]} and by "
                                            f"{owner}; give one of them another port (or drop the explicit port "
                                            f"to let epdctl choose)"))
                return
        if port + size - 1 > 65535:
            plan.problems.append((path, f"port {port} for {owner} is out of range"))
        for p in range(port, port + size):
            taken[node][p] = owner

    wanted: list[tuple[tuple[str, int], str, str, int, str]] = []  # key, node, label, size, path
    for w in topo.workers:
        for rank, node in enumerate(w.nodes):
            key = (w.name, rank)
            plan.workers[key] = {}
            for label, size in engine.port_needs(topo, w, rank):
                # an explicit HTTP port is every rank's (published multi-node commands give all
                # ranks the same --port); bootstrap and dist-init ports live on rank 0 only
                fixed = _explicit(w, label) if rank == 0 or label == "http" else None
                if fixed is not None:
                    plan.workers[key][label] = fixed
                    claim(node, fixed, size, f"{w.name} {label}", w.path)
                else:
                    wanted.append((key, node, label, size, w.path))
    router_wanted: list[tuple[str, int | None]] = []
    if topo.router is not None and topo.router.node in taken:
        r: Router = topo.router
        for label, fixed in (("http", r.port), ("prometheus", r.prometheus_port)):
            if fixed is not None:
                plan.router[label] = fixed
                claim(r.node, fixed, 1, f"router {label}", f"router.{'port' if label == 'http' else 'prometheus_port'}")
            else:
                router_wanted.append((label, None))
    cursor = {n.name: n.port_base or topo.ports.base for n in topo.nodes}

    def allocate(node: str, size: int, owner: str, path: str) -> int | None:
        p = cursor[node]
        while any(q in taken[node] for q in range(p, p + size)):
            p += 1
        if p + size - 1 > limit:
            plan.problems.append((path, f"node {node!r} ran out of ports for {owner}: the range starts at "
                                        f"{cursor[node]} and ends at {limit}; raise ports.limit or the node's "
                                        f"port_base"))
            return None
        for q in range(p, p + size):
            taken[node][q] = owner
        cursor[node] = p + size
        return p

    def assign(items: list[tuple[tuple[str, int], str, str, int, str]]) -> None:
        for key, node, label, size, path in items:
            port = allocate(node, size, f"{key[0]} {label}", path)
            if port is not None:
                plan.workers[key][label] = port

    assign([x for x in wanted if x[2] not in LATE])
    for label, _ in router_wanted:
        assert topo.router is not None
        port = allocate(topo.router.node, 1, f"router {label}", "router")
        if port is not None:
            plan.router[label] = port
    assign([x for x in wanted if x[2] in LATE])
    return plan
