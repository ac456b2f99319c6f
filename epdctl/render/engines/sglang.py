"""SGLang 0.5.23 server commands (full canonical flag names only; see docs/topology.md).

Encoders are wired with ``--encoder-urls`` on the prefill, not ``--encoder-register-urls`` on
the encoders: epdctl knows every encoder at render time, the prefill then needs no start-order
handshake (encoders start first and would otherwise have to find a live prefill bootstrap
server), and the prefill's EncoderBootstrapServer still accepts /register_encoder_url later for
live rebalancing.
"""

from __future__ import annotations

from epdctl.render.context import WorkerContext
from epdctl.topology.inplace import switchable
from epdctl.topology.model import Role

HEALTH_PATH = "/health"


def _transfer(ctx: WorkerContext) -> list[str]:
    backend = ctx.topo.transfer.backend
    nics = [n.name for n in ctx.transfer_nics() if n.kind in ("ib", "roce")]
    if backend == "mooncake" and not nics:
        return ["--disaggregation-transfer-backend", "mooncake_tcp"]  # TCP when the node has no RDMA NIC
    out = ["--disaggregation-transfer-backend", backend]
    if nics:
        out += ["--disaggregation-ib-device", ",".join(nics)]
    return out


def _encoder_backend(ctx: WorkerContext) -> list[str]:
    kind = ctx.topo.transfer.embeddings or "zmq"
    return ["--encoder-transfer-backend", "mooncake" if kind == "mooncake" else "zmq_to_scheduler"]


def worker_command(ctx: WorkerContext) -> tuple[tuple[str, ...], dict[str, str]]:
    topo, w, s = ctx.topo, ctx.worker, ctx.worker.settings
    m = topo.model
    argv = [topo.python, "-m", "sglang.launch_server", "--model-path", m.path, "--served-model-name", m.served_name,
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
        argv += ["--encoder-only"] + _encoder_backend(ctx)
    elif w.role is Role.PREFILL:
        argv += ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port",
                 str(ctx.leader_ports["bootstrap"])] + _transfer(ctx)
        if topo.has_encoders:
            argv += ["--language-only", "--encoder-urls", *ctx.encoder_urls, "--encoder-bootstrap-port",
                     str(ctx.leader_ports["encoder_bootstrap"])] + _encoder_backend(ctx)
    elif w.role is Role.DECODE:
        argv += ["--disaggregation-mode", "decode"] + _transfer(ctx)
        if switchable(topo, w):  # a role-switch instance runs its bootstrap server in both roles
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
    argv += list(s.args)
    return tuple(argv), {}
