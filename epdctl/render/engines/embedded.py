"""The embedded CPU engine: ``python -m epdctl.runtime <role> ...`` (docs/architecture.md)."""

from __future__ import annotations

from epdctl.render.context import WorkerContext
from epdctl.topology.inplace import switchable
from epdctl.topology.model import Role


def worker_command(ctx: WorkerContext) -> tuple[tuple[str, ...], dict[str, str]]:
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
    if switchable(topo, w):
        argv += ["--switchable"]
    argv += list(w.settings.args)
    return tuple(argv), {}
