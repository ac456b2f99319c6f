"""What the topology (and its plan) expect of each node: placements, NIC endpoints, node checks,
and how to reach the node.

Why here and not in the checks: the checks take plain records (``NodeExpect``, ``Endpoint``) so
they can be tested from fixtures; this module is the only one that reads the topology model.
"""

from __future__ import annotations

from typing import Any, Mapping

from epdctl.containers.registry import runtime_for
from epdctl.containers.wrap import wrapped
from epdctl.engines import engine_of
from epdctl.preflight.container_checks import ContainerProbe
from epdctl.preflight.container_text import probe_command
from epdctl.preflight.links import Endpoint, Placement
from epdctl.preflight.node_checks import RDMA_KINDS, NicExpect, NodeExpect
from epdctl.preflight.runners import NodeRunner
from epdctl.state.store import worker_of
from epdctl.topology.container import rdma_nics
from epdctl.topology.model import Topology
from epdctl.render.plan import Plan


def _role(value: Any) -> str:
    return str(getattr(value, "value", value))


def placements(topo: Topology, plan: Plan | None = None) -> list[Placement]:
    """Every (worker, node rank) of the plan, or of the topology when no plan is given."""
    if plan is not None:
        return [Placement(worker_of(w.name), _role(w.role), w.node, int(w.node_rank or 0))
                for w in plan.workers]
    return [Placement(w.name, _role(w.role), node, rank)
            for w in topo.workers for rank, node in enumerate(w.nodes)]


def transport_of(topo: Topology) -> str:
    """The agent's transport: mooncake when KV or embeddings go over Mooncake, else ZMQ."""
    t = topo.transfer
    return "mooncake" if "mooncake" in (t.backend, t.embeddings) else "zmq"


def version_keys(topo: Topology) -> tuple[str, ...]:
    """Packages whose versions must match on every node for this topology."""
    engine = engine_of(topo).package_keys
    transport = ("mooncake",) if transport_of(topo) == "mooncake" else ("pyzmq",)
    return ("python", "epdctl", *engine, *transport)


def endpoints(topo: Topology, node_name: str) -> list[Endpoint]:
    """The node's transfer endpoints: the transfer NICs that have an IP (RDMA NICs first when
    the backend is an RDMA engine), else the node's host address."""
    node = topo.node(node_name)
    nics = [n for n in node.nics if n.ip]
    if topo.transfer.nics:
        nics = [n for n in nics if n.name in topo.transfer.nics]
    if topo.transfer.backend in ("mooncake", "nixl") and any(n.kind in RDMA_KINDS for n in nics):
        nics = [n for n in nics if n.kind in RDMA_KINDS]
    if not nics:
        return [Endpoint(node.name, "host", "eth", node.host, None)]
    return [Endpoint(node.name, n.name, n.kind, n.ip or node.host, n.speed_gbps) for n in nics]


def _ports(topo: Topology, plan: Plan | None) -> dict[str, list[tuple[str, int]]]:
    out: dict[str, list[tuple[str, int]]] = {}
    if plan is not None:
        for w in plan.workers:
            for p in (w.port, getattr(w, "bootstrap_port", None),
                      getattr(w, "encoder_bootstrap_port", None)):
                if p:
                    out.setdefault(w.node, []).append((w.host, int(p)))
        r = getattr(plan, "router", None)
        if r is not None:
            for p in (r.port, getattr(r, "prometheus_port", None)):
                if p:
                    out.setdefault(r.node, []).append((r.host, int(p)))
        return out
    for tw in topo.workers:
        for rank, node in enumerate(tw.nodes):
            ports = (tw.port, tw.bootstrap_port, tw.encoder_bootstrap_port) if rank == 0 else ()
            for p in (*ports, tw.dist_init_port if rank == 0 else None):
                if p:
                    out.setdefault(node, []).append((tw.settings.host, int(p)))
    if topo.router is not None:
        for p in (topo.router.port, topo.router.prometheus_port):
            if p:
                out.setdefault(topo.router.node, []).append((topo.router.host, int(p)))
    return out


def used_nodes(topo: Topology) -> list[str]:
    names = {n for w in topo.workers for n in w.nodes}
    if topo.router is not None:
        names.add(topo.router.node)
    return [n.name for n in topo.nodes if n.name in names]


def expectations(topo: Topology, plan: Plan | None = None, min_disk_gb: float = 1.0) -> dict[str, NodeExpect]:
    ports = _ports(topo, plan)
    uses_gpus = engine_of(topo).uses_gpus
    rdma_backend = topo.transfer.backend in ("mooncake", "nixl")
    out: dict[str, NodeExpect] = {}
    for name in used_nodes(topo):
        node = topo.node(name)
        needed = sum(w.gpus_per_node for w in topo.workers if name in w.nodes) if uses_gpus else 0
        nics = tuple(NicExpect(n.name, n.kind, n.ip, n.speed_gbps, n.port) for n in node.nics)
        out[name] = NodeExpect(
            node=name, nics=nics, gpus=node.gpus or needed,
            model_path=topo.model.path if any(name in w.nodes for w in topo.workers) else None,
            ports=tuple(dict.fromkeys(ports.get(name, []))), min_disk_gb=min_disk_gb,
            rdma_transport=rdma_backend and any(n.kind in RDMA_KINDS for n in node.nics))
    return out


def container_probes(topo: Topology, plan: Plan | None) -> dict[str, list[ContainerProbe]]:
    """Per node, each distinct container its workers run, with the commands that check it: the
    probe is the worker's own container command (render's, ``containers/wrap.py``) around
    ``container_text.probe_command``."""
    out: dict[str, list[ContainerProbe]] = {}
    seen: dict[tuple[str, str], int] = {}
    workers = {w.name: w for w in topo.workers}
    for spec in plan.workers if plan is not None else ():
        tw = workers.get(spec.worker or worker_of(spec.name))
        if spec.container is None or tw is None or tw.settings.container is None:
            continue
        rdma = bool(rdma_nics(topo, tw, spec.node)) and topo.transfer.rdma != "off"
        gpus = bool(spec.gpus) or tw.settings.container.gpus == "all"
        probe = probe_command(rdma, gpus)
        c, _, argv, steps = wrapped(topo, tw, spec.node, f"check-{spec.node}-{len(out.get(spec.node, []))}",
                                    probe, (), tuple(spec.gpus))  # no stores: `up` makes them
        key = (spec.node, repr((c, rdma, gpus)))
        if key in seen:
            p = out[spec.node][seen[key]]
            out[spec.node][seen[key]] = ContainerProbe(**{**p.__dict__, "workers": (*p.workers, spec.name)})
            continue
        runtime = runtime_for(c.runtime)
        seen[key] = len(out.setdefault(spec.node, []))
        out[spec.node].append(ContainerProbe(
            node=spec.node, runtime=c.runtime, image=c.image, workers=(spec.name,), version=runtime.version(c),
            inspect=runtime.image_digest(c), pull=runtime.pull(c), probe=None if steps else argv,
            rdma=rdma, gpus=gpus))
    return out


def runners_for(topo: Topology, launcher: Any = None) -> Mapping[str, NodeRunner]:
    """How to reach every node the topology uses: the way ``launcher`` (default: the
    topology's own) reaches them; the launcher knows how (``Launcher.node_runners``)."""
    if launcher is None:
        from epdctl.launchers import get_launcher

        launcher = get_launcher(topo.launcher, None, topo)
    runners: Mapping[str, NodeRunner] = launcher.node_runners(used_nodes(topo))
    return runners
