"""SGLang 0.5.23 server commands (full canonical flag names only; see docs/topology.md).

Encoders are wired with ``--encoder-urls`` on the prefill, not ``--encoder-register-urls`` on
the encoders: epdctl knows every encoder at render time, the prefill then needs no start-order
handshake (encoders start first and would otherwise have to find a live prefill bootstrap
server), and the prefill's EncoderBootstrapServer still accepts /register_encoder_url later for
live rebalancing.
"""

from __future__ import annotations

from epdctl.render.context import WorkerContext
from epdctl.topology.migrations import canonical_args
from epdctl.topology.inplace import switchable
from epdctl.topology.model import Role

HEALTH_PATH = "/health"
MODULE = "sglang.launch_server"


def _rdma_nics(ctx: WorkerContext) -> list[str]:
    """The worker's RDMA devices; none when transfer.rdma is auto (SGLang discovers them) or off."""
    if ctx.topo.transfer.rdma != "nics":
        return []
    return [n.name for n in ctx.transfer_nics() if n.kind in ("ib", "roce")]


def _transfer(ctx: WorkerContext) -> list[str]:
    backend, rdma = ctx.topo.transfer.backend, ctx.topo.transfer.rdma
    nics = _rdma_nics(ctx)
    if backend == "mooncake" and (rdma == "off" or (rdma == "nics" and not nics)):
        return ["--disaggregation-transfer-backend", "mooncake_tcp"]  # TCP when the node has no RDMA NIC
    out = ["--disaggregation-transfer-backend", backend]
    if nics:
        out += ["--disaggregation-ib-device", ",".join(nics)]
    return out


def _encoder_backend(ctx: WorkerContext) -> list[str]:
    """Only when transfer.embeddings says so: SGLang's own default (auto) picks per model and TP."""
    kind = ctx.topo.transfer.embeddings
    if kind is None:
        return []
    return ["--encoder-transfer-backend", "mooncake" if kind == "mooncake" else "zmq_to_scheduler"]


def _encoder_ib(ctx: WorkerContext) -> list[str]:
    """An encoder sending embeddings over Mooncake needs its IB device like a prefill does."""
    nics = _rdma_nics(ctx)
    return ["--disaggregation-ib-device", ",".join(nics)] if ctx.topo.transfer.embeddings == "mooncake" and nics \
        else []


def _mooncake_ep(ctx: WorkerContext, args: list[str]) -> list[str]:
    """--mooncake-ib-device for Mooncake expert parallelism, from the same NICs as the KV transfer."""
    s = ctx.worker.settings
    uses = s.moe_a2a_backend == "mooncake" or any(
        a == "--elastic-ep-backend" and b == "mooncake" for a, b in zip(args, args[1:]))
    nics = _rdma_nics(ctx)
    if not uses or not nics or "--mooncake-ib-device" in args:
        return []
    return ["--mooncake-ib-device", ",".join(nics)]


def worker_command(ctx: WorkerContext) -> tuple[tuple[str, ...], dict[str, str]]:
    topo, w, s = ctx.topo, ctx.worker, ctx.worker.settings
    m = topo.model
    argv = [topo.python, "-m", s.module or MODULE, "--model-path", m.path, "--served-model-name", m.served_name,
            "--host", ctx.bind, "--port", str(ctx.ports["http"])]
    if m.dtype:
        argv += ["--dtype", m.dtype]
    if m.trust_remote_code:
        argv += ["--trust-remote-code"]
    argv += ["--tp-size", str(s.tp)]
    if s.pp > 1:
        argv += ["--pp-size", str(s.pp)]
    if s.dp > 1:
        argv += ["--dp-size", str(s.dp)]
    if s.attention_dp > 1:
        argv += ["--attn-dp-size", str(s.attention_dp)]
    if s.ep is not None:
        argv += ["--ep-size", str(s.ep)]
    if s.moe_a2a_backend:
        argv += ["--moe-a2a-backend", s.moe_a2a_backend]
    argv += ["--base-gpu-id", str(w.base_gpu_ids[ctx.rank] if w.base_gpu_ids else 0)]
    if ctx.nnodes > 1:
        argv += ["--dist-init-addr", f"{ctx.leader_host}:{ctx.leader_ports['dist_init']}",
                 "--nnodes", str(ctx.nnodes), "--node-rank", str(ctx.rank)]
    if w.role is Role.ENCODER:
        argv += ["--encoder-only"] + _encoder_backend(ctx) + _encoder_ib(ctx)
    elif w.role is Role.PREFILL:
        argv += ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port",
                 str(ctx.leader_ports["bootstrap"])] + _transfer(ctx)
        if topo.has_encoders:
            argv += ["--language-only", "--encoder-urls", *ctx.encoder_urls, "--encoder-bootstrap-port",
                     str(ctx.leader_ports["encoder_bootstrap"])] + _encoder_backend(ctx)
    elif w.role is Role.DECODE:
        argv += ["--disaggregation-mode", "decode"] + _transfer(ctx)
        if w.bootstrap_port is not None:  # the prefill side's port, for requests that carry none
            argv += ["--disaggregation-bootstrap-port", str(w.bootstrap_port)]
        elif switchable(topo, w):  # a role-switch instance runs its bootstrap server in both roles
            argv += ["--disaggregation-bootstrap-port", str(ctx.leader_ports["bootstrap"])]
    if switchable(topo, w):
        argv += ["--enable-pd-role-switch"]
    if s.chunked_prefill_size is not None and w.role is not Role.ENCODER:
        argv += ["--chunked-prefill-size", str(s.chunked_prefill_size)]
    if s.page_size is not None and w.role is not Role.ENCODER:
        argv += ["--page-size", str(s.page_size)]
    if s.kv_cache_dtype is not None and w.role is not Role.ENCODER:
        argv += ["--kv-cache-dtype", s.kv_cache_dtype]
    if s.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", str(s.mem_fraction_static)]
    if s.max_running_requests is not None and w.role is not Role.ENCODER:
        argv += ["--max-running-requests", str(s.max_running_requests)]
    if w.role is not Role.ENCODER:
        argv += ["--enable-metrics"]  # the router polls /metrics; epdctl status reads it
    args = canonical_args(s.args, "sglang")
    argv += _mooncake_ep(ctx, args) + args
    env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, w.gpu_ids))} if w.gpu_ids else {}
    return tuple(argv), env
