"""Frozen records for a loaded topology (what the schema reader produces, what render consumes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from epdctl.containers.spec import Container, Mount
from epdctl.topology.limits import Limits


class Role(str, Enum):
    """A process's job: a worker's role (start order is the declaration order below) or the
    router. Written and formatted as its value (``f"{role}"`` is ``decode``)."""

    ENCODER = "encoder"
    PREFILL = "prefill"
    DECODE = "decode"
    COLOCATED = "colocated"
    ROUTER = "router"  # the router process: no topology role

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


ROLE_ORDER = (Role.ENCODER, Role.PREFILL, Role.DECODE, Role.COLOCATED)


@dataclass(frozen=True)
class Nic:
    """A network interface of a node (an RDMA device name such as mlx5_0, or eth0)."""

    name: str
    kind: str  # ib | roce | eth
    ip: str | None = None
    speed_gbps: float | None = None
    port: int | None = None  # the HCA port the engines use (default 1: Mooncake's MC_IB_PORT, NCCL's :1)


@dataclass(frozen=True)
class SSH:
    """How the ssh launcher reaches a node."""

    user: str | None = None
    port: int = 22
    key: str | None = None
    jump: str | None = None


@dataclass(frozen=True)
class Settings:
    """Per-worker engine settings after layering (topology defaults < role < node < worker)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int | None = None
    attention_dp: int = 1
    chunked_prefill_size: int | None = None
    page_size: int | None = None
    kv_cache_dtype: str | None = None
    moe_a2a_backend: str | None = None
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    host: str = "127.0.0.1"
    nics: tuple[str, ...] | None = None
    module: str | None = None  # launcher module, e.g. dynamo.sglang (default: the engine's own)
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    args_src: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (YAML path of an args key, its tokens)
    cpus: tuple[int, ...] | None = None  # embedded runtime: the CPU ids the worker pins itself to
    startup_timeout: float | None = None  # seconds to become healthy; None: scaled with the weights
    container: Container | None = None  # runs inside this container (None: bare on the node)

    @property
    def gpus(self) -> int:
        """GPUs one worker occupies: tp*pp per replica times dp replicas (attention DP lives inside tp)."""
        return self.tp * self.pp * self.dp


@dataclass(frozen=True)
class Worker:
    """One engine server. A multi-node worker lists several nodes (index = node rank)."""

    role: Role
    index: int
    nodes: tuple[str, ...]
    settings: Settings
    path: str  # YAML path it came from, for messages
    base_gpu_ids: tuple[int, ...] = ()  # per node rank; filled by placement
    port: int | None = None
    bootstrap_port: int | None = None
    encoder_bootstrap_port: int | None = None
    dist_init_port: int | None = None
    base_gpu_id: int | None = None  # explicit first GPU on every node of the worker
    gpu_ids: tuple[int, ...] = ()  # explicit GPUs (CUDA_VISIBLE_DEVICES) on every node of the worker
    own_env: dict[str, str] = field(default_factory=dict)  # the worker's own env: beats node env
    transfer_port: int | None = None  # embedded runtime: its E->P / P->D transfer endpoint

    @property
    def name(self) -> str:
        return f"{self.role.value}-{self.index}"

    @property
    def gpus_per_node(self) -> int:
        return self.settings.gpus // len(self.nodes)


@dataclass(frozen=True)
class Node:
    """A machine: where workers run and how to reach it."""

    name: str
    host: str
    gpus: int = 0
    ssh: SSH = field(default_factory=SSH)
    nics: tuple[Nic, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    setup: tuple[str, ...] = ()
    port_base: int | None = None
    shared: bool = False

    def nic(self, name: str) -> Nic | None:
        return next((n for n in self.nics if n.name == name), None)


@dataclass(frozen=True)
class HubRef:
    """``hf: ORG/NAME[@REVISION]``: a Hugging Face hub repository at a branch, tag or commit."""

    repo: str
    revision: str = "main"

    def __str__(self) -> str:
        return f"{self.repo}@{self.revision}"


@dataclass(frozen=True)
class Model:
    """The weights. ``path`` is what the engines get: the staged copy when ``stage`` is set, else
    the snapshot in ``cache`` (``hf:``) or the folder the topology names. ``origin`` is where the
    weights are read from (the folder, or the snapshot); ``cache`` is HF_HOME, on shared storage."""

    path: str
    served_name: str
    dtype: str | None = None
    architecture: str | None = None
    trust_remote_code: bool = False
    hub: HubRef | None = None
    cache: str | None = None
    stage: str | None = None
    origin: str = ""

    @property
    def source(self) -> str:
        """How the topology names the weights: ``hf:ORG/NAME@REV`` or the folder."""
        return f"hf:{self.hub}" if self.hub else (self.origin or self.path)


@dataclass(frozen=True)
class Transfer:
    """KV (and embedding) transport. ``nics`` picks NICs by name; default: every ib/roce NIC."""

    backend: str = "zmq"
    embeddings: str | None = None
    rdma: str = "nics"  # nics: RDMA over declared ib/roce NICs (TCP if none) | auto: SGLang finds them | off
    nics: tuple[str, ...] | None = None
    ec_storage_path: str | None = None
    store: str | None = None  # shared-storage: the store directory (default: /tmp/epdctl-store/NAME)


@dataclass(frozen=True)
class Router:
    node: str
    host: str = "127.0.0.1"
    port: int | None = None
    prometheus_host: str | None = None
    prometheus_port: int | None = None
    api_key_env: str | None = None
    implementation: str = "smg"
    policy: str | None = None
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Slurm:
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    gpus_per_node: int | None = None
    qos: str | None = None
    constraint: str | None = None
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Ports:
    base: int = 30000
    limit: int | None = None


@dataclass(frozen=True)
class AnswerCheck:
    """``check:``: the user's questions with expected answers, asked before `up` says ready."""

    answers: str              # JSONL file, absolute
    min_correct: float = 1.0  # share of answers that must be right


@dataclass(frozen=True)
class Topology:
    name: str
    model: Model
    engine: str
    launcher: str
    nodes: tuple[Node, ...]
    workers: tuple[Worker, ...]  # start order: encoders, prefills, decodes, colocated
    transfer: Transfer
    router: Router | None
    slurm: Slurm | None
    ports: Ports
    python: str = "python3"
    engine_version: str | None = None  # engine.version: the release (default: the engine's default record)
    engine_venv: str | None = None  # engine.venv: the engine's virtual environment on every node
    engine_python: str | None = None  # engine.python: the engine's interpreter on every node
    engine_device: str | None = None  # engine.device: the record's device form (SGLang: cuda | cpu)
    in_place: bool = True  # rebalance.in_place: start workers switchable where the engine can (Engine.switch)
    limits: Limits = field(default_factory=Limits)
    source: Path | None = None
    restart: dict[str, Any] = field(default_factory=dict, compare=False)  # role -> RestartPolicy
    check: AnswerCheck | None = None
    lines: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    @property
    def engine_interpreter(self) -> str:
        """The Python that runs the engine on the nodes: engine.python, engine.venv's, else ``python``."""
        if self.engine_python:
            return self.engine_python
        if self.engine_venv:
            return f"{self.engine_venv.rstrip('/')}/bin/python"
        return self.python

    def role_workers(self, role: Role) -> tuple[Worker, ...]:
        return tuple(w for w in self.workers if w.role is role)

    @property
    def has_encoders(self) -> bool:
        return any(w.role is Role.ENCODER for w in self.workers)
