"""Cluster state on disk: the run folder is the database.

Layout, under ``$EPDCTL_STATE_DIR`` (default ``~/.epdctl``)::

    clusters/<name>/state.json   what `up` started: one record per process (pid, process group, ...)
    clusters/<name>/lock         fcntl lock held by the command that changes the cluster
    clusters/<name>/logs/<worker>.log

Why this shape: `status`, `logs` and `down` run later from another shell, so everything they need
is on disk. Writes are atomic (temp file + fsync + rename) so a reader never sees half a file,
and a command that changes the cluster (`up`, `down`) holds an exclusive lock so two of them can
never interleave. Readers do not lock: the atomic rename is enough for them, and `status` must
not block behind a long `up`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from epdctl.errors import StateError
from epdctl.state.check import check_state
from epdctl.render.plan import ProcessSpec
from epdctl.topology.model import Role
from epdctl.state.lock import ClusterLock
from epdctl.state.v1 import add_capabilities, upgrade_v1

STATE_DIR_ENV = "EPDCTL_STATE_DIR"
STATE_VERSION = 2
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def state_root() -> Path:
    """The state directory: ``$EPDCTL_STATE_DIR`` or ``~/.epdctl``."""
    env = os.environ.get(STATE_DIR_ENV)
    return Path(env).expanduser() if env else Path.home() / ".epdctl"


@dataclass
class Handle:
    """Where a launcher put one process: enough to find, signal and read it from another shell.

    local/ssh: ``pid``/``pgid`` + ``create_time`` (the pid-reuse guard); ssh adds nothing here
    (the node's address is in ``ssh-nodes.json``); slurm: ``job`` and ``step`` (``scancel
    JOB.STEP``) plus the local ``srun`` client's pid. ``host`` is the address the process serves
    on when the launcher, not the topology, chose it (a SLURM node's NodeAddr).
    """

    pid: int = 0
    pgid: int = 0
    create_time: float = 0.0
    host: str | None = None
    job: str | None = None
    step: str | None = None
    token: str | None = None      # the EPDCTL_TOKEN marker the process carries (its identity)

    @property
    def step_id(self) -> str | None:
        return f"{self.job}.{self.step}" if self.job and self.step is not None else None


@dataclass
class ProcessRecord:
    """One process of a cluster (a worker rank or the router): its plan's ``ProcessSpec``, field
    for field, plus what launching added (``handle``, ``since``, ``log``, ``router_id``, the
    restart policy). Nothing here is parsed back out of ``argv``."""

    name: str                      # prefill-0, prefill-0.r1 (rank 1), router
    role: str                      # a Role (encoder | prefill | decode | colocated | router)
    node: str
    argv: list[str] = field(default_factory=list)   # ${VAR} references, never secret values
    env: dict[str, str] = field(default_factory=dict)
    worker: str = ""               # the logical worker (prefill-0 for every rank); router: router
    engine: str = "embedded"
    node_rank: int = 0
    nnodes: int = 1
    host: str = "127.0.0.1"
    port: int = 0                  # ports["http"]
    url: str = ""
    health_path: str = "/health"
    ready_path: str | None = None  # also 200 before `up` counts it ready (vLLM: /v1/models)
    bootstrap_port: int | None = None          # ports["bootstrap"]
    encoder_bootstrap_port: int | None = None  # ports["encoder_bootstrap"]
    prometheus_port: int | None = None         # ports["prometheus"]
    is_leader: bool = True
    log: str = ""
    since: float = 0.0
    handle: Handle | None = None
    router_id: str | None = None   # smg worker id when registered through POST /workers
    restart: dict[str, Any] = field(default_factory=dict)  # policy, limit, backoff (supervise.py)
    ports: dict[str, int] = field(default_factory=dict)  # every port it listens on, by name
    setup: list[str] = field(default_factory=list)       # the node's setup lines, run before argv
    gpus: list[int] = field(default_factory=list)
    switchable: bool = False       # started able to change role in place
    router_type: str | None = None  # how the router lists it; None: not routed
    registers_workers: bool = False  # the router: epdctl adds its workers through its API
    key_vars: list[str] = field(default_factory=list)  # variables it reads the API key from
    prometheus_host: str | None = None
    container: dict[str, Any] = field(default_factory=dict)  # runtime, image, name, options: `down` removes it
    step_options: list[str] = field(default_factory=list)  # srun options of a containerized step

    def __post_init__(self) -> None:
        self.worker = self.worker or self.name
        named = {"http": self.port or None, "bootstrap": self.bootstrap_port,
                 "encoder_bootstrap": self.encoder_bootstrap_port, "prometheus": self.prometheus_port}
        self.ports = {**{k: v for k, v in named.items() if v is not None}, **self.ports}
        self.port = self.ports.get("http", 0)
        self.bootstrap_port = self.ports.get("bootstrap")
        self.encoder_bootstrap_port = self.ports.get("encoder_bootstrap")
        self.prometheus_port = self.ports.get("prometheus")
        if self.role in _ROLES:
            self.role = Role(self.role)

    @property
    def pid(self) -> int:
        return self.handle.pid if self.handle else 0

    @classmethod
    def of(cls, spec: ProcessSpec, engine: str, log: Path | str = "") -> "ProcessRecord":
        """The record of a planned process (before it is started)."""
        return cls(name=spec.name, role=spec.role, node=spec.node, argv=list(spec.argv), env=dict(spec.env),
                   worker=spec.worker or worker_of(spec.name), engine=engine, node_rank=spec.node_rank,
                   nnodes=spec.nnodes, host=spec.host, url=spec.url, health_path=spec.health_path,
                   ready_path=spec.ready_path,
                   is_leader=spec.is_leader, log=str(log), ports=dict(spec.ports), setup=list(spec.setup),
                   gpus=list(spec.gpus), switchable=spec.switchable, router_type=spec.router_type,
                   registers_workers=spec.registers_workers, key_vars=list(spec.key_vars),
                   prometheus_host=spec.prometheus_host, step_options=list(spec.step_options),
                   container={"runtime": spec.container.runtime, "image": spec.container.image,
                              "name": spec.container_name, "options": list(spec.container.options)}
                   if spec.container is not None else {})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ProcessRecord":
        if not isinstance(d, dict):
            raise ValueError("a process record is not an object")
        known = {f for f in cls.__dataclass_fields__}
        args = {k: v for k, v in d.items() if k in known}
        if isinstance(args.get("handle"), dict):
            hk = set(Handle.__dataclass_fields__)
            args["handle"] = Handle(**{k: v for k, v in args["handle"].items() if k in hk})
        return cls(**args)


_ROLES = {r.value for r in Role}


def worker_of(name: str) -> str:
    """The plan names rank r>0 of a multi-node worker ``NAME.rR``; this is the one place that
    knows it (records carry ``worker`` and ``node_rank`` so nothing else has to)."""
    base, sep, rank = name.rpartition(".r")
    return base if sep and rank.isdigit() else name


@dataclass
class ClusterState:
    """Everything `status`, `logs` and `down` need about a started cluster."""

    name: str
    topology: str
    launcher: str
    engine: str = "embedded"
    phase: str = "starting"       # starting | running | stopping
    created: float = field(default_factory=time.time)
    api_key_env: str | None = None
    model: str | None = None
    processes: list[ProcessRecord] = field(default_factory=list)
    stores: dict[str, list[str]] = field(default_factory=dict)  # node -> transfer store dirs `down` removes
    version: int = STATE_VERSION

    @property
    def router(self) -> ProcessRecord | None:
        return next((p for p in self.processes if p.role == "router"), None)

    @property
    def workers(self) -> list[ProcessRecord]:
        return [p for p in self.processes if p.role != "router"]

    def find(self, name: str) -> ProcessRecord | None:
        return next((p for p in self.processes if p.name == name), None)

    def ranks(self, worker: str) -> list[ProcessRecord]:
        """Every rank of one logical worker, rank 0 first."""
        return sorted((p for p in self.processes if p.worker == worker), key=lambda p: p.node_rank)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ClusterState":
        if not isinstance(d.get("processes", []), list):
            raise ValueError("processes is not a list")
        procs = [ProcessRecord.from_dict(p) for p in d.get("processes", [])]
        known = {f for f in cls.__dataclass_fields__} - {"processes"}
        return cls(processes=procs, **{k: v for k, v in d.items() if k in known})


def check_name(name: str) -> str:
    """Reject cluster names that cannot be a folder name."""
    if not _NAME_RE.match(name):
        raise StateError(
            f"invalid cluster name {name!r}: use letters, digits, '.', '_' or '-' (at most 64)"
        )
    return name


class ClusterDir(ClusterLock):
    """Names every file of one cluster's run folder and reads/writes its state."""

    def __init__(self, name: str, root: Path | None = None):
        self.name = check_name(name)
        self.root = (root or state_root()) / "clusters" / name

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    def log(self, worker: str) -> Path:
        return self.log_dir / f"{worker}.log"

    def exists(self) -> bool:
        return self.state_file.exists()

    def load(self) -> ClusterState | None:
        """The recorded state, or None when nothing is recorded; StateError if unreadable
        (any bytes: not UTF-8, not JSON, wrong types) naming `down --force` as the way out."""
        try:
            raw = self.state_file.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StateError(f"cannot read {self.state_file}: {e.strerror}") from e
        try:
            data = json.loads(raw.decode("utf-8"))
            if not isinstance(data, dict):
                raise ValueError("top level is not an object")
            if data.get("version") == 1:
                data = upgrade_v1(data)
            if data.get("version") == 2:
                data = add_capabilities(data)
            if data.get("version") != STATE_VERSION:
                raise ValueError(f"unknown state version {data.get('version')!r}")
            check_state(data)
            return ClusterState.from_dict(data)
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise StateError(
                f"cluster state {self.state_file} is damaged ({str(e)[:200]}). `epdctl down "
                f"{self.name} --force` stops every process that carries the cluster's marker "
                f"(nothing else) and forgets the state; logs stay in {self.log_dir}"
            ) from e

    def save(self, state: ClusterState) -> None:
        """Write state.json atomically: temp file in the same folder, fsync, rename."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".state.json.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(state.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_file)
        dfd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def clear(self) -> None:
        """Forget the state (after `down`); logs stay for later reading."""
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()


def list_clusters(root: Path | None = None) -> list[str]:
    """Names of clusters that have recorded state."""
    base = (root or state_root()) / "clusters"
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if (p / "state.json").exists())


def resolve_cluster(name: str | None, root: Path | None = None) -> ClusterDir:
    """Pick the cluster: the one named, or the only one recorded."""
    if name:
        cd = ClusterDir(name, root)
        if not cd.exists():
            known = list_clusters(root)
            hint = f"known clusters: {', '.join(known)}" if known else "no cluster is recorded"
            raise StateError(f"no cluster named {name!r} ({hint}); start one with `epdctl up`")
        return cd
    names = list_clusters(root)
    if not names:
        raise StateError(
            f"no cluster is recorded under {state_root() if root is None else root}; "
            "start one with `epdctl up TOPOLOGY`"
        )
    if len(names) > 1:
        raise StateError(f"several clusters are recorded ({', '.join(names)}); name one")
    return ClusterDir(names[0], root)
