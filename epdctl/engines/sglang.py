"""SGLang 0.5.23: server commands (full canonical flag names only; see docs/topology.md) and the
engine record.

Encoders are wired with ``--encoder-urls`` on the prefill, not ``--encoder-register-urls`` on
the encoders: epdctl knows every encoder at render time, the prefill then needs no start-order
handshake (encoders start first and would otherwise have to find a live prefill bootstrap
server), and the prefill's EncoderBootstrapServer still accepts /register_encoder_url later for
live rebalancing.

``engine: {name: sglang, device: cpu}`` selects the CPU form of the release (SGLANG_0_5_23_CPU):
its workers start with ``--device cpu`` and ``SGLANG_USE_CPU_ENGINE=1`` (SGLang's CPU platform)
and are placed on no GPU (no ``--base-gpu-id``, no ``CUDA_VISIBLE_DEVICES``); docs/real-engines-sglang.md.

In place (``--enable-pd-role-switch``) SGLang flips prefill <-> decode through ``POST
/pd_role_switch``; its own argument check (``sglang/srt/arg_groups/pd_disaggregation_hook.py``)
refuses expert or pipeline parallelism, MoE all-to-all, decode context parallelism and
speculative decoding, and only KV managers with ``supports_role_switch`` (Mooncake, Mori; not
NIXL) can flip. An EPD prefill is ``--language-only`` with ``--encoder-urls``, which a flip
does not rebuild, so with encoders in the topology SGLang moves restart.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from epdctl.engines.base import Canary, Engine, Problems, RoleSwitch
from epdctl.engines.context import WorkerContext
from epdctl.topology.model import Role, Topology, Worker

MODULE = "sglang.launch_server"
DIST_INIT_BLOCK = 8  # SGLang derives ZMQ ports from dist_init_port .. +6, plus the NCCL port
# hf_config.architectures[0] values SGLang 0.5.23 accepts with --encoder-only / --language-only.
EPD_ARCHITECTURES = (
    "Qwen2VLForConditionalGeneration", "Qwen3VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
    "InternS2PreviewForConditionalGeneration", "Qwen3OmniMoeForConditionalGeneration",
    "Qwen2AudioForConditionalGeneration", "Qwen2_5OmniForConditionalGeneration", "Dots3NoteForCausalLM",
    "KimiVLForConditionalGeneration", "KimiK25ForConditionalGeneration", "KimiK3ForConditionalGeneration",
    "MiMoV2ForCausalLM", "Glm5NextForConditionalGeneration", "MiniMaxM3SparseForConditionalGeneration",
    "MuseSparkForConditionalGeneration",
)
SWITCH_BACKENDS = ("mooncake",)
_SWITCH_ARGS = ("--speculative-algorithm", "--dcp-size", "--ep-size", "--expert-parallel-size", "--ep",
                "--pp-size", "--pipeline-parallel-size")
MANAGED = ("--model-path", "--model", "--host", "--port", "--served-model-name", "--tp-size",
           "--tensor-parallel-size", "--pp-size", "--pipeline-parallel-size", "--dp-size", "--data-parallel-size",
           "--attn-dp-size", "--attention-data-parallel-size", "--ep-size", "--expert-parallel-size", "--ep",
           "--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr", "--disaggregation-mode",
           "--disaggregation-bootstrap-port", "--encoder-only", "--language-only", "--encoder-urls",
           "--encoder-bootstrap-port", "--base-gpu-id", "--disaggregation-transfer-backend",
           "--disaggregation-ib-device", "--api-key", "--admin-api-key")


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


def worker_command(engine: Engine, ctx: WorkerContext) -> tuple[tuple[str, ...], dict[str, str]]:
    topo, w, s = ctx.topo, ctx.worker, ctx.worker.settings
    m = topo.model
    argv = [topo.engine_interpreter, "-m", s.module or MODULE, "--model-path", m.path, "--served-model-name", m.served_name,
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
    if engine.uses_gpus:
        argv += ["--base-gpu-id", str(w.base_gpu_ids[ctx.rank] if w.base_gpu_ids else 0)]
    if engine.device == "cpu":
        argv += ["--device", "cpu"]
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
        elif engine.switchable(topo, w):  # a role-switch instance runs its bootstrap server in both roles
            argv += ["--disaggregation-bootstrap-port", str(ctx.leader_ports["bootstrap"])]
    if engine.switchable(topo, w):
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
    args = engine.canonical(s.args)
    argv += _mooncake_ep(ctx, args) + args
    env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, w.gpu_ids))} if w.gpu_ids and engine.uses_gpus else {}
    if engine.device == "cpu":
        env["SGLANG_USE_CPU_ENGINE"] = "1"  # SGLang's CPU platform: torch ops on the CPU, no CUDA probing
    return tuple(argv), env


@dataclass(frozen=True)
class SGLang(Engine):
    def worker_command(self, ctx: WorkerContext) -> tuple[tuple[str, ...], dict[str, str]]:
        return worker_command(self, ctx)

    def _leader_ports(self, topo: Topology, w: Worker) -> list[tuple[str, int]]:
        if w.role is Role.PREFILL:
            return [("bootstrap", 1)] + ([("encoder_bootstrap", 1)] if topo.has_encoders else [])
        if w.role is Role.DECODE and self.switchable(topo, w):
            return [("bootstrap", 1)]  # SGLang's role switch starts the bootstrap server on decodes too
        return []

    def _role_refused(self, role: Role) -> list[str]:
        return [f"SGLang switches only prefill <-> decode, not {role.value}"]

    def _target_refused(self, role: Role) -> list[str]:
        return [f"SGLang switches only prefill <-> decode, not to {role.value}"]

    def _switch_limits(self, topo: Topology, w: Worker) -> list[str]:
        """Why SGLang cannot flip ``w`` between prefill and decode (empty: it can)."""
        s = w.settings
        out = []
        if topo.has_encoders:
            out.append("the prefills are --language-only with --encoder-urls (EPD), which a flip does not rebuild")
        if topo.transfer.backend not in SWITCH_BACKENDS:
            out.append(f"transfer backend {topo.transfer.backend} has no role switch (Mooncake does)")
        if s.ep is not None and s.ep > 1:
            out.append(f"expert parallelism (ep {s.ep})")
        if s.pp > 1:
            out.append(f"pipeline parallelism (pp {s.pp})")
        if s.moe_a2a_backend and s.moe_a2a_backend != "none":
            out.append(f"MoE all-to-all ({s.moe_a2a_backend})")
        out += [f"{a} in args" for a in _SWITCH_ARGS if a in s.args]
        return out

    def setting_problems(self, topo: Topology, w: Worker) -> Problems:
        yield from super().setting_problems(topo, w)
        if w.settings.cpus is not None and not self.uses_gpus:
            yield w.path, ("cpus: pins embedded runtime workers to CPU cores; SGLang on the CPU binds its own "
                           "threads (env SGLANG_CPU_OMP_THREADS_BIND, on CPUs with AMX or arm64) — drop cpus")

    def transfer_problems(self, topo: Topology) -> Problems:
        if topo.transfer.backend == "zmq" and topo.role_workers(Role.PREFILL):
            yield "transfer.backend", ("SGLang has no zmq KV transfer; use mooncake (RDMA, or TCP when the nodes "
                                       "have no ib/roce NIC) or nixl")

    def switch_memory(self, topo: Topology, workers: list[Worker]) -> list[str] | None:
        return [f"in place: {len(workers)} prefill/decode worker(s) start --enable-pd-role-switch: same "
                "weights in both roles; SGLang sizes the request pool for decode and starts a bootstrap "
                "server on every instance"]


SGLANG_0_5_23 = SGLang(
    name="sglang", label="SGLang", version="0.5.23", flag_table="sglang", takes_module=True, managed_flags=MANAGED,
    switch=RoleSwitch(roles=(Role.PREFILL, Role.DECODE), flag="--enable-pd-role-switch", protocol="pd_role_switch",
                      how="POST /pd_role_switch", keeps_bootstrap=True, resumes_after=True),
    pauses_on_drain=True, canary=Canary(token_check=True), package_keys=("sglang",),
    epd_architectures=EPD_ARCHITECTURES, dist_init_ports=DIST_INIT_BLOCK, command_prefix=3, device="cuda")
# the same release on the CPU (`engine.device: cpu`): SGLang's CPU platform, no GPU placed
SGLANG_0_5_23_CPU = dataclasses.replace(SGLANG_0_5_23, device="cpu", uses_gpus=False,
                                        managed_flags=MANAGED + ("--device",))
