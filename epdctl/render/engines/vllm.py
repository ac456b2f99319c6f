"""vLLM 0.33.0 ``vllm serve`` commands: NixlConnector (or MooncakeConnector) for KV, the EC
connector (ECExampleConnector) for encoder disaggregation, ``--headless`` for node ranks > 0."""

from __future__ import annotations

import json

from epdctl.render.context import WorkerContext
from epdctl.topology.migrations import canonical_args
from epdctl.topology.model import Role

A2A = {"deepep": "deepep_low_latency", "deepep_v2": "deepep_v2", "pplx": "pplx", "nixl": "nixl_ep",
       "flashinfer": "flashinfer_all2allv", "mori": "mori_low_latency", "none": "allgather_reducescatter"}


def _compact(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=False)


def worker_command(ctx: WorkerContext) -> tuple[tuple[str, ...], dict[str, str]]:
    topo, w, s = ctx.topo, ctx.worker, ctx.worker.settings
    m = topo.model
    argv = ["vllm", "serve", m.path, "--served-model-name", m.served_name, "--host", ctx.bind,
            "--port", str(ctx.ports["http"])]
    if m.dtype:
        argv += ["--dtype", m.dtype]
    if m.trust_remote_code:
        argv += ["--trust-remote-code"]
    argv += ["--tensor-parallel-size", str(s.tp)]
    if s.pp > 1:
        argv += ["--pipeline-parallel-size", str(s.pp)]
    if s.dp > 1 or s.attention_dp > 1:
        argv += ["--data-parallel-size", str(max(s.dp, s.attention_dp))]
    if s.ep is not None and s.ep > 1:
        argv += ["--enable-expert-parallel"]
        if s.moe_a2a_backend:
            argv += ["--all2all-backend", A2A.get(s.moe_a2a_backend, "allgather_reducescatter")]
    if ctx.nnodes > 1:
        argv += ["--nnodes", str(ctx.nnodes), "--node-rank", str(ctx.rank), "--master-addr", ctx.leader_host,
                 "--master-port", str(ctx.leader_ports["dist_init"])]
        if ctx.rank > 0:
            argv += ["--headless"]
    env: dict[str, str] = {}
    gpus = w.gpus_per_node
    if w.gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in w.gpu_ids)
    elif gpus:
        base = w.base_gpu_ids[ctx.rank]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(base, base + gpus))
    ec_path = topo.transfer.ec_storage_path or f"/tmp/epdctl-ec-cache/{topo.name}"
    ec = {"ec_connector": "ECExampleConnector", "ec_connector_extra_config": {"shared_storage_path": ec_path}}
    kv_connector = "MooncakeConnector" if topo.transfer.backend == "mooncake" else "NixlConnector"
    if w.role is Role.ENCODER:
        argv += ["--mm-encoder-only", "--ec-transfer-config", _compact({**ec, "ec_role": "ec_producer"}),
                 "--disable-prefix-caching"]
    elif w.role in (Role.PREFILL, Role.DECODE):
        if w.role is Role.PREFILL and topo.has_encoders:
            argv += ["--ec-transfer-config", _compact({**ec, "ec_role": "ec_consumer"})]
        role = "kv_producer" if w.role is Role.PREFILL else "kv_consumer"
        argv += ["--kv-transfer-config", _compact({"kv_connector": kv_connector, "kv_role": role})]
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = ctx.node.host
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(ctx.ports["side_channel"])
        nics = [n.name for n in ctx.transfer_nics() if n.kind in ("ib", "roce")]
        if nics:
            env["UCX_NET_DEVICES"] = ",".join(f"{n}:1" for n in nics)
    if s.chunked_prefill_size is not None and s.chunked_prefill_size > 0 and w.role is not Role.ENCODER:
        argv += ["--max-num-batched-tokens", str(s.chunked_prefill_size)]
    if s.page_size is not None:
        argv += ["--block-size", str(s.page_size)]
    if s.kv_cache_dtype is not None:
        argv += ["--kv-cache-dtype", {"bf16": "bfloat16", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}.get(
            s.kv_cache_dtype, s.kv_cache_dtype)]
    if s.mem_fraction_static is not None:
        argv += ["--gpu-memory-utilization", str(s.mem_fraction_static)]
    if s.max_running_requests is not None:
        argv += ["--max-num-seqs", str(s.max_running_requests)]
    argv += canonical_args(s.args, "vllm")
    return tuple(argv), env
