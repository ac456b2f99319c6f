"""Topology -> Plan: per-worker specs in start order plus the router. Pure and deterministic.

argv items (and env values) of the form ``${NAME}`` are references to the launching
environment (secrets such as the router API key); launchers expand them, renders print them
as ``"${NAME}"``, and no secret value ever enters a plan.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from epdctl.containers.wrap import wrapped
from epdctl.errors import RenderError
from epdctl.engines import Engine, engine_of
from epdctl.engines.context import WorkerContext
from epdctl.render.router import registers_workers, router_argv
from epdctl.topology.model import Container, Role, Topology, Worker
from epdctl.topology.ports import plan_ports


# how the router lists a routed worker (``POST /workers`` worker_type); encoders are not routed
ROUTER_TYPES: dict[Role, str] = {Role.PREFILL: "prefill", Role.DECODE: "decode", Role.COLOCATED: "regular"}


@dataclass(frozen=True)
class ProcessSpec:
    """One process as render plans it: a worker on one node (a multi-node worker has one per
    node rank) or the router. Everything a launcher, `status`, `rebalance` or a canary needs to
    know about it is a field here; nobody reads it back out of ``argv``."""

    name: str
    role: Role
    node: str
    host: str  # the address it binds
    url: str  # the address others reach it at
    ports: dict[str, int]  # every port it listens on, by name: http, bootstrap, dist_init, prometheus, ...
    argv: tuple[str, ...]
    env: dict[str, str]
    worker: str = ""  # the logical worker (every rank of prefill-0 is prefill-0); the router: router
    setup: tuple[str, ...] = ()  # the node's setup lines, run before the command
    node_rank: int = 0
    nnodes: int = 1
    is_leader: bool = True
    health_path: str = "/health"
    ready_path: str | None = None  # also answered 200 before `up` counts it ready (vLLM: /v1/models)
    gpus: tuple[int, ...] = ()
    switchable: bool = False  # started able to change role in place (Engine.switch)
    router_type: str | None = None  # how the router lists it; None: not routed (encoders, ranks > 0)
    registers_workers: bool = False  # the router: epdctl adds its workers through its API
    key_vars: tuple[str, ...] = ()  # variables it reads the cluster's API key from (by name)
    prometheus_host: str | None = None  # the router's metrics address
    api_key_env: str | None = None  # the router: the variable holding the cluster's API key
    container: Container | None = None  # argv runs this container (defaults filled in: containers/wrap.py)
    container_name: str = ""  # epdctl-<cluster>-<process>; `down` removes it by this name
    step_options: tuple[str, ...] = ()  # srun options putting the step in its container (pyxis, slurm-oci)

    @property
    def port(self) -> int:
        return self.ports["http"]

    @property
    def bootstrap_port(self) -> int | None:
        return self.ports.get("bootstrap")

    @property
    def encoder_bootstrap_port(self) -> int | None:
        return self.ports.get("encoder_bootstrap")

    @property
    def prometheus_port(self) -> int | None:
        return self.ports.get("prometheus")


P = TypeVar("P")


def placed_plan(plan: P, place: Callable[[str], str]) -> P:
    """``plan`` at the addresses a launcher chose: the one place addresses are rewritten (for
    `up`, before the records are made; for `rebalance`, for every plan it starts from)."""
    router = getattr(plan, "router")
    return dataclasses.replace(plan, workers=[placed(w, place) for w in getattr(plan, "workers")],  # type: ignore[type-var]
                               router=placed(router, place) if router is not None else None)


def placed(spec: ProcessSpec, place: Callable[[str], str]) -> ProcessSpec:
    """``spec`` at the addresses a launcher chose (``Launcher.place``; SLURM: the allocated nodes')."""
    return dataclasses.replace(spec, host=place(spec.host), url=place(spec.url),
                               argv=tuple(place(a) for a in spec.argv),
                               env={k: place(v) for k, v in spec.env.items()},
                               prometheus_host=place(spec.prometheus_host) if spec.prometheus_host else None)


@dataclass(frozen=True)
class Plan:
    name: str
    engine: str
    workers: list[ProcessSpec] = field(default_factory=list)
    router: ProcessSpec | None = None
    setup: dict[str, tuple[str, ...]] = field(default_factory=dict)  # node -> setup lines
    restart: dict[str, dict[str, Any]] = field(default_factory=dict)  # role -> restart policy
    stores: dict[str, tuple[str, ...]] = field(default_factory=dict)  # node -> transfer store directories

    def for_node(self, node: str) -> list[ProcessSpec]:
        return [w for w in self.workers if w.node == node]

    def placed(self, place: Callable[[str], str]) -> "Plan":
        return placed_plan(self, place)

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
    engine = engine_of(topo)
    leaders: dict[str, tuple[str, dict[str, int]]] = {}
    for w in topo.workers:
        leaders[w.name] = (advertised(topo, w.settings.host, w.nodes[0]), ports.workers[(w.name, 0)])
    encoder_urls = [f"http://{h}:{p['http']}" for w in topo.role_workers(Role.ENCODER)
                    for h, p in [leaders[w.name]]]
    specs: list[ProcessSpec] = []
    for w in topo.workers:
        for rank, node in enumerate(w.nodes):
            ctx = WorkerContext(topo=topo, worker=w, rank=rank, node=topo.node(node),
                                ports=ports.workers[(w.name, rank)], leader_ports=ports.workers[(w.name, 0)],
                                bind=bind_host(topo, w.settings.host, node), encoder_urls=tuple(encoder_urls),
                                leader_host=topo.node(w.nodes[0]).host)
            argv, env = engine.worker_command(ctx)
            # most specific wins: defaults < role < node < the worker's own env < what the engine adds
            specs.append(_spec(topo, engine, w, rank, node, ctx, argv,
                               {**w.settings.env, **topo.node(node).env, **w.own_env, **env}))
    router = None
    if topo.router is not None:
        r = topo.router
        host = bind_host(topo, r.host, r.node)
        prom_host = bind_host(topo, r.prometheus_host, r.node) if r.prometheus_host else host
        argv = router_argv(topo, specs, host, ports.router["http"], prom_host, ports.router["prometheus"])
        url_host = advertised(topo, r.host, r.node)
        router = ProcessSpec(name="router", role=Role.ROUTER, node=r.node, host=host,
                             url=f"http://{_bracket(url_host)}:{ports.router['http']}",
                             ports={"http": ports.router["http"], "prometheus": ports.router["prometheus"]},
                             argv=argv, env=dict(topo.node(r.node).env), worker="router",
                             setup=topo.node(r.node).setup, registers_workers=registers_workers(argv),
                             key_vars=(r.api_key_env,) if r.api_key_env else (), prometheus_host=prom_host,
                             api_key_env=r.api_key_env)
    setup = {n.name: n.setup for n in topo.nodes if n.setup}
    dirs = engine.store_dirs(topo)
    stores = {n: dirs for n in dict.fromkeys(n for w in topo.workers for n in w.nodes)} if dirs else {}
    return Plan(name=topo.name, engine=topo.engine, workers=specs, router=router, setup=setup,
                restart={role: {**p.to_dict(), "standby": p.standby and engine.warm_standby and role != "router"}
                         for role, p in topo.restart.items()}, stores=stores)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _spec(topo: Topology, engine: Engine, w: Worker, rank: int, node: str, ctx: WorkerContext,
          argv: tuple[str, ...], env: dict[str, str]) -> ProcessSpec:
    p = ctx.ports
    url_host = advertised(topo, w.settings.host, node)
    per = w.gpus_per_node if engine.uses_gpus else 0
    gpus = tuple(range(w.base_gpu_ids[rank], w.base_gpu_ids[rank] + per)) if per else ()
    if w.gpu_ids:
        gpus = w.gpu_ids
    key = topo.router.api_key_env if topo.router is not None and engine.reads_api_key else None
    name = w.name if rank == 0 else f"{w.name}.r{rank}"
    container: Container | None = None
    cname, steps = "", tuple[str, ...]()
    if w.settings.container is not None:
        container, cname, argv, steps = wrapped(topo, w, node, name, argv, (*env, *((key,) if key else ())), gpus,
                                                engine.store_dirs(topo))
    return ProcessSpec(name=name, role=w.role, node=node, host=ctx.bind,
                       url=f"http://{_bracket(url_host)}:{p['http']}", ports=dict(p), argv=argv, env=env,
                       worker=w.name, setup=topo.node(node).setup, node_rank=rank, nnodes=len(w.nodes),
                       is_leader=rank == 0, gpus=gpus, switchable=engine.switchable(topo, w),
                       router_type=ROUTER_TYPES.get(w.role) if rank == 0 else None,
                       ready_path=engine.ready_path if rank == 0 else None,
                       key_vars=(key,) if key else (), container=container, container_name=cname,
                       step_options=steps)
