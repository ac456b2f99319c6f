"""What epdctl knows about one engine release: a record the rest of the control plane reads
instead of branching on the engine's name.

A new engine version is a new instance (its own ``version`` and ``flag_table``); a new engine is
a new subclass with its command builder and the few methods that differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from epdctl.engines.context import WorkerContext
from epdctl.engines.wrappers import wrapped_table
from epdctl.topology.engine_flags import FlagTable, flag_table
from epdctl.topology.migrations import canonical_args
from epdctl.topology.model import Role, Topology, Worker

Problems = Iterator[tuple[str, str]]  # (YAML path, message)
ROUTED = {Role.PREFILL.value: "prefill", Role.DECODE.value: "decode", Role.COLOCATED.value: "regular"}


@dataclass(frozen=True)
class RoleSwitch:
    """How an engine changes a running worker's role in place."""

    roles: tuple[Role, ...]  # the roles a worker switches between
    flag: str  # the start flag that makes a worker switchable
    protocol: str  # the HTTP call: "pd_role_switch" (SGLang) | "admin_switch_role" (embedded)
    how: str  # for plans: "POST /pd_role_switch"
    keeps_bootstrap: bool = False  # a switchable decode keeps its own bootstrap port (SGLang)
    resumes_after: bool = False  # the drain paused generation: continue it after the switch


@dataclass(frozen=True)
class Canary:
    """What the canaries read from the engine."""

    transfer_counters: bool = False  # /metrics carries epd transfer byte counters
    token_check: bool = False  # the bootstrap-room token check (SGLang's contract) applies
    pairs: bool = False  # every encoder/prefill/decode pair can be driven directly
    connectors: bool = False  # vLLM: KV-connector token counters and the transfer store (canary.connectors)


@dataclass(frozen=True)
class ImportTraits:
    """How `epdctl import` reads this engine's published launch commands."""

    common_names: bool = False  # its flags are renamed to the common (SGLang) names before they are read
    rendered: tuple[str, ...] = ()  # flags the command builder writes from roles and transfer: not kept as args
    rendered_encoder: tuple[str, ...] = ()  # the same, on encoders only
    kv_connector: bool = False  # KV transfer is read from --kv-transfer-config (else --disaggregation-* flags)
    ucx_nics: bool = False  # UCX_NET_DEVICES names the worker's NICs (rendered from them, not kept as env)


@dataclass(frozen=True)
class Engine:
    """One engine release. Subclasses give the command builder and what differs per engine."""

    name: str
    label: str  # as messages name it: "SGLang"
    version: str
    flag_table: str  # flags/<flag_table>.json (migrations: flags/<flag_table>_migrations.json)
    uses_gpus: bool = True
    device: str | None = None  # the topology's engine.device this record answers to (None: the engine names none)
    single_process: bool = False  # one CPU process per worker: no tp/pp/dp
    takes_module: bool = False  # a worker may name an SGLang-compatible launcher module
    managed_flags: tuple[str, ...] = ()  # flags epdctl renders itself (refused in args)
    switch: RoleSwitch | None = None
    reads_api_key: bool = False  # every worker takes the cluster's key (its variable's name on the command)
    warm_standby: bool = False  # a worker started with EPDCTL_STANDBY_FD waits, imports done, for its go
    pauses_on_drain: bool = False  # the drain pauses generation (aborting what is left) once idle
    idle_gauges: tuple[str, ...] = ()  # /metrics gauges that all read 0 on an idle worker (empty: /v1/loads says)
    step_counter: str | None = None  # a /metrics series that grows on every engine step (idle_gauges that stay
    # up while it stands still are stale)
    routed_encoders: bool = False  # the router sends images to the encoders (registered with it as "encode");
    # else the prefills call them through their encoder registries
    canary: Canary = Canary()
    package_keys: tuple[str, ...] = ()  # packages whose versions must match on every node
    epd_architectures: tuple[str, ...] | None = None  # architectures encoder disaggregation takes (None: any)
    dist_init_ports: int = 1  # consecutive ports a multi-node worker's rank 0 needs for dist-init
    command_prefix: int = 3  # argv items before the engine's flags (``python -m sglang.launch_server``)
    imports: ImportTraits = ImportTraits()
    ready_path: str | None = None  # a second page `up` waits for after /health (vLLM: /v1/models)

    def worker_command(self, ctx: WorkerContext) -> tuple[tuple[str, ...], dict[str, str]]:
        raise NotImplementedError

    def router_type(self, role: str) -> str | None:
        """The ``worker_type`` a leader of ``role`` is registered with in the router's
        ``POST /workers`` (None: the router does not call it)."""
        if role == Role.ENCODER.value:
            return "encode" if self.routed_encoders else None
        return ROUTED.get(role)

    def flags(self, role: Role | None = None, module: str | None = None) -> FlagTable:
        """The flag table the worker's engine args are checked against: the engine's, plus the
        wrapper's own flags when the worker runs through a wrapper ``module`` (dynamo.sglang)."""
        return wrapped_table(self.flag_table, module) if module and self.takes_module else flag_table(self.flag_table)

    def canonical(self, args: tuple[str, ...] | list[str]) -> list[str]:
        """``args`` as the engine's launcher reads them, every flag spelled in full."""
        return canonical_args(args, self.flag_table)

    def port_needs(self, topo: Topology, w: Worker, rank: int) -> list[tuple[str, int]]:
        """(label, how many consecutive ports) ``w`` needs on the node of ``rank``."""
        out = [("http", 1)] + (self._leader_ports(topo, w) if rank == 0 else [])
        if rank == 0 and len(w.nodes) > 1:
            out.append(("dist_init", self.dist_init_ports))
        return out + self._rank_ports(topo, w)

    def _leader_ports(self, topo: Topology, w: Worker) -> list[tuple[str, int]]:
        return []

    def _rank_ports(self, topo: Topology, w: Worker) -> list[tuple[str, int]]:
        return []

    def switch_blockers(self, topo: Topology, w: Worker) -> list[str]:
        """Why ``w`` cannot be started switchable (empty: it is, unless the topology says
        ``rebalance: {in_place: false}``)."""
        if not topo.in_place:
            return ["the topology says rebalance: {in_place: false}"]
        if self.switch is None:
            return [f"{self.name} has no in-place role switch"]
        if w.role not in self.switch.roles:
            return self._role_refused(w.role)
        return self._switch_limits(topo, w)

    def switchable(self, topo: Topology, w: Worker) -> bool:
        return not self.switch_blockers(topo, w)

    def move_path(self, topo: Topology, src: Worker, new_role: Role) -> tuple[str, str]:
        """("in-place" | "restart", why) for moving ``src`` to ``new_role``."""
        why = self.switch_blockers(topo, src)
        if not why and self.switch is not None and new_role not in self.switch.roles:
            why = self._target_refused(new_role)
        if why or self.switch is None:
            return "restart", "; ".join(why)
        return "in-place", f"{self.switch.how}, model stays loaded"

    def _role_refused(self, role: Role) -> list[str]:
        return [f"a {role.value} worker does not switch"]

    def _target_refused(self, role: Role) -> list[str]:
        return []

    def _switch_limits(self, topo: Topology, w: Worker) -> list[str]:
        return []

    def setting_problems(self, topo: Topology, w: Worker) -> Problems:
        """Worker settings this engine cannot take."""
        s = w.settings
        if s.module is not None and not self.takes_module:
            yield w.path, (f"module ({s.module}) is for SGLang-compatible launchers such as dynamo.sglang; the "
                           f"{self.name} engine has its own command: drop module")
        if s.cpus is not None and self.uses_gpus:
            yield w.path, (f"cpus: pins embedded runtime workers to CPU cores; {self.name} workers are placed "
                           "on GPUs (gpus/base_gpu_id) — drop cpus")

    def transfer_problems(self, topo: Topology) -> Problems:
        """The transfer section's backends this engine cannot use."""
        return iter(())

    def store_dirs(self, topo: Topology) -> tuple[str, ...]:
        """Directories the transfer moves data through, which epdctl empties at `up` and removes
        at `down` on every node that runs a worker (epdctl/orchestrate/stores.py)."""
        return ()

    def switch_memory(self, topo: Topology, workers: list[Worker]) -> list[str] | None:
        """What switchable workers hold, when the engine says it without reading the weights."""
        return None
