"""Topology -> Plan: per-worker specs in start order plus the router. Pure and deterministic.

argv items (and env values) of the form ``${NAME}`` are references to the launching
environment (secrets such as the router API key); launchers expand them, renders print them
as ``"${NAME}"``, and no secret value ever enters a plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from epdctl.errors import RenderError
from epdctl.render.context import WorkerContext
from epdctl.render.engines import ENGINES
from epdctl.render.router import router_argv
from epdctl.topology.model import Role, Topology, Worker
from epdctl.topology.ports import plan_ports


@dataclass(frozen=True)
class WorkerSpec:
    """One process on one node (a multi-node worker has one spec per node rank)."""

    name: str
    role: str
    node: str
    host: str
    port: int
    bootstrap_port: int | None
    encoder_bootstrap_port: int | None
    node_rank: int
    nnodes: int
    argv: tuple[str, ...]
    env: dict[str, str]
    url: str
    health_path: str = "/health"
    is_leader: bool = True
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class RouterSpec:
    """The router process (smg or sglang-router)."""

    node: str
    host: str
    port: int
    prometheus_port: int
    argv: tuple[str, ...]
    env: dict[str, str]
    url: str
    api_key_env: str | None = None
    health_path: str = "/health"


@dataclass(frozen=True)
class Plan:
    name: str
    engine: str
    workers: list[WorkerSpec] = field(default_factory=list)
    router: RouterSpec | None = None
    setup: dict[str, tuple[str, ...]] = field(default_factory=dict)  # node -> setup lines
    restart: dict[str, dict[str, Any]] = field(default_factory=dict)  # role -> restart policy

    def for_node(self, node: str) -> list[WorkerSpec]:
        return [w for w in self.workers if w.node == node]

    @property
    def nodes(self) -> list[str]:
        """Nodes that run something, in first-start order."""
        out = [w.node for w in self.workers] + ([self.router.node] if self.router else [])
        return list(dict.fromkeys(out))


def bind_host(topo: Topology, host: str, node: str) -> str:
    """The address a process binds: ``node`` means the node's address."""
    return topo.node(node).host if host == "node" else host


def advertised(topo: Topology, host: str, node: str) -> str:
    """The address others use to reach a process bound to ``host`` on ``node``."""
    h = bind_host(topo, host, node)
    return topo.node(node).host if h in ("0.0.0.0", "::") else h


def build_plan(topo: Topology) -> Plan:
    """The full plan; raises RenderError if the topology asks for something an engine cannot do."""
    ports = plan_ports(topo)
    if ports.problems:
        raise RenderError("; ".join(f"{p}: {m}" for p, m in ports.problems))
    engine = ENGINES.get(topo.engine)
    if engine is None:
        raise RenderError(f"unknown engine {topo.engine!r}")
    leaders: dict[str, tuple[str, dict[str, int]]] = {}
    for w in topo.workers:
        leaders[w.name] = (advertised(topo, w.settings.host, w.nodes[0]), ports.workers[(w.name, 0)])
    encoder_urls = [f"http://{h}:{p['http']}" for w in topo.role_workers(Role.ENCODER)
                    for h, p in [leaders[w.name]]]
    specs: list[WorkerSpec] = []
    for w in topo.workers:
        for rank, node in enumerate(w.nodes):
            ctx = WorkerContext(topo=topo, worker=w, rank=rank, node=topo.node(node),
                                ports=ports.workers[(w.name, rank)], leader_ports=ports.workers[(w.name, 0)],
                                bind=bind_host(topo, w.settings.host, node), encoder_urls=tuple(encoder_urls),
                                leader_host=topo.node(w.nodes[0]).host)
            argv, env = engine.worker_command(ctx)
            # most specific wins: defaults < role < node < the worker's own env < what the engine adds
            specs.append(_spec(topo, w, rank, node, ctx, argv,
                               {**w.settings.env, **topo.node(node).env, **w.own_env, **env}))
    router = None
    if topo.router is not None:
        r = topo.router
        host = bind_host(topo, r.host, r.node)
        prom_host = bind_host(topo, r.prometheus_host, r.node) if r.prometheus_host else host
        argv = router_argv(topo, specs, host, ports.router["http"], prom_host, ports.router["prometheus"])
        url_host = advertised(topo, r.host, r.node)
        router = RouterSpec(node=r.node, host=host, port=ports.router["http"],
                            prometheus_port=ports.router["prometheus"], argv=argv, env=dict(topo.node(r.node).env),
                            url=f"http://{_bracket(url_host)}:{ports.router['http']}", api_key_env=r.api_key_env)
    setup = {n.name: n.setup for n in topo.nodes if n.setup}
    return Plan(name=topo.name, engine=topo.engine, workers=specs, router=router, setup=setup,
                restart={role: p.to_dict() for role, p in topo.restart.items()})


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _spec(topo: Topology, w: Worker, rank: int, node: str, ctx: WorkerContext, argv: tuple[str, ...],
          env: dict[str, str]) -> WorkerSpec:
    p = ctx.ports
    host = ctx.bind
    url_host = advertised(topo, w.settings.host, node)
    per = w.gpus_per_node if topo.engine != "embedded" else 0
    gpus = tuple(range(w.base_gpu_ids[rank], w.base_gpu_ids[rank] + per)) if per else ()
    if w.gpu_ids:
        gpus = w.gpu_ids
    return WorkerSpec(name=w.name if rank == 0 else f"{w.name}.r{rank}", role=w.role.value, node=node, host=host,
                      port=p["http"], bootstrap_port=p.get("bootstrap"),
                      encoder_bootstrap_port=p.get("encoder_bootstrap"), node_rank=rank, nnodes=len(w.nodes),
                      argv=argv, env=env, url=f"http://{_bracket(url_host)}:{p['http']}", is_leader=rank == 0,
                      gpus=gpus)
