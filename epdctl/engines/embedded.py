"""The embedded CPU engine: ``python -m epdctl.runtime <role> ...`` (docs/architecture.md).

Every encoder, prefill and decode started ``--switchable`` keeps the whole model and switches
between all three roles through ``POST /admin/switch_role`` (docs/rebalance.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from epdctl.engines.base import Canary, Engine, Problems, RoleSwitch
from epdctl.engines.context import WorkerContext
from epdctl.topology.engine_flags import FlagTable, flag_table
from epdctl.topology.limits import Limits
from epdctl.topology.model import Role, Topology, Worker

MANAGED = ("--model-path", "--host", "--port", "--served-model-name", "--transport", "--bootstrap-port",
           "--encoder-bootstrap-port", "--encoder-urls", "--register-urls", "--transfer-port", "--cpus")

# limits key -> runtime flag, and the roles that take it (docs/limits.md)
_FLAGS = {
    "max_body_bytes": ("--max-body-bytes", (Role.ENCODER, Role.PREFILL, Role.DECODE, Role.COLOCATED)),
    "max_images_per_request": ("--max-images-per-request", (Role.ENCODER, Role.PREFILL, Role.DECODE, Role.COLOCATED)),
    "max_image_pixels": ("--max-image-pixels", (Role.ENCODER, Role.PREFILL, Role.COLOCATED)),
    "max_request_pixels": ("--max-request-pixels", (Role.ENCODER, Role.PREFILL, Role.COLOCATED)),
    "max_prompt_tokens": ("--max-prompt-tokens", (Role.PREFILL, Role.COLOCATED)),
    "max_image_bytes": ("--max-image-bytes", (Role.PREFILL, Role.COLOCATED)),
    "image_fetch_timeout_s": ("--image-fetch-timeout", (Role.PREFILL, Role.COLOCATED)),
    "image_fetch_hosts": ("--image-fetch-hosts", (Role.PREFILL, Role.COLOCATED)),
}


def limit_flags(limits: Limits, role: Role) -> list[str]:
    """The runtime flags for the limits the topology sets (the others keep the same defaults there)."""
    out: list[str] = []
    for key, (flag, roles) in _FLAGS.items():
        if key not in limits.given or role not in roles:
            continue
        value = getattr(limits, key)
        out += [flag, *value] if isinstance(value, tuple) else [flag, f"{value:g}" if isinstance(value, float)
                                                                 else str(value)]
    if role is Role.ENCODER and limits.image_fetch_hosts:
        # images fetched by the prefill reach the encoder base64-encoded: let it take a full request's worth
        need = limits.max_images_per_request * limits.max_image_bytes * 4 // 3 + 65536
        if need > limits.max_body_bytes:
            out = [t for i, t in enumerate(out) if t != "--max-body-bytes" and (i == 0 or out[i - 1] != "--max-body-bytes")]
            out += ["--max-body-bytes", str(need)]
    return out


def api_key_flags(topo: Topology, role: Role, in_place: bool = False) -> list[str]:
    """Every embedded worker takes the cluster's key (its /metrics, the encoder registry, the KV
    bootstrap, a switchable worker's POST /admin/switch_role); the variable's name, never the key,
    is rendered."""
    key_env = topo.router.api_key_env if topo.router is not None else None
    return ["--api-key-env", key_env] if key_env else []


def worker_command(engine: Engine, ctx: WorkerContext) -> tuple[tuple[str, ...], dict[str, str]]:
    topo, w = ctx.topo, ctx.worker
    m = topo.model
    transport = topo.transfer.backend
    argv = [topo.python, "-m", "epdctl.runtime", w.role.value, "--model-path", m.path]
    if w.role is not Role.ENCODER:
        argv += ["--served-model-name", m.served_name]
    argv += ["--host", ctx.bind, "--port", str(ctx.ports["http"])]
    if w.role is Role.PREFILL:
        argv += ["--bootstrap-port", str(ctx.ports["bootstrap"]),
                 "--encoder-bootstrap-port", str(ctx.ports["encoder_bootstrap"])]
        if ctx.encoder_urls:
            argv += ["--encoder-urls", *ctx.encoder_urls]
    if w.role is not Role.COLOCATED:
        argv += ["--transport", transport, "--transfer-port", str(ctx.ports["transfer"])]
        nics = [n.name for n in ctx.transfer_nics()]
        if transport == "mooncake" and nics and w.role in (Role.ENCODER, Role.PREFILL):
            argv += ["--ib-device", ",".join(nics)]
    if w.settings.cpus is not None:
        argv += ["--cpus", ",".join(map(str, w.settings.cpus))]
    if w.settings.max_running_requests is not None and w.role is not Role.ENCODER:
        argv += ["--max-running-requests", str(w.settings.max_running_requests)]
    in_place = engine.switchable(topo, w)
    argv += limit_flags(topo.limits, w.role) + api_key_flags(topo, w.role, in_place)
    if in_place:
        argv += ["--switchable"]
    argv += list(w.settings.args)
    return tuple(argv), {}


@dataclass(frozen=True)
class Embedded(Engine):
    def worker_command(self, ctx: WorkerContext) -> tuple[tuple[str, ...], dict[str, str]]:
        return worker_command(self, ctx)

    def flags(self, role: Role | None = None, module: str | None = None) -> FlagTable:
        return flag_table(self.flag_table, role.value if role is not None else None)

    def _leader_ports(self, topo: Topology, w: Worker) -> list[tuple[str, int]]:
        return [("bootstrap", 1), ("encoder_bootstrap", 1)] if w.role is Role.PREFILL else []

    def _rank_ports(self, topo: Topology, w: Worker) -> list[tuple[str, int]]:
        # the runtime's ZMQ (or Mooncake control) transfer endpoint
        return [("transfer", 1)] if w.role is not Role.COLOCATED else []

    def transfer_problems(self, topo: Topology) -> Problems:
        b = topo.transfer.backend
        if b == "nixl":
            yield "transfer.backend", "the embedded engine transfers over zmq or mooncake; nixl is for GPU engines"
        if topo.transfer.embeddings not in (None, b):
            yield "transfer.embeddings", (f"the embedded engine moves embeddings and KV over one transport "
                                          f"(transfer.backend: {b}); drop transfer.embeddings or set it to {b}")


EMBEDDED = Embedded(
    name="embedded", label="embedded", version="runtime", flag_table="embedded", uses_gpus=False,
    single_process=True, managed_flags=MANAGED, reads_api_key=True, warm_standby=True,
    switch=RoleSwitch(roles=(Role.ENCODER, Role.PREFILL, Role.DECODE), flag="--switchable",
                      protocol="admin_switch_role", how="POST /admin/switch_role"),
    canary=Canary(transfer_counters=True, token_check=True, pairs=True), package_keys=("torch", "transformers"),
    command_prefix=3)
