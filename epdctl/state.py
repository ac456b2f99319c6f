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
import fcntl
import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from epdctl.errors import StateError

STATE_DIR_ENV = "EPDCTL_STATE_DIR"
STATE_VERSION = 1
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def state_root() -> Path:
    """The state directory: ``$EPDCTL_STATE_DIR`` or ``~/.epdctl``."""
    env = os.environ.get(STATE_DIR_ENV)
    return Path(env).expanduser() if env else Path.home() / ".epdctl"


@dataclass
class ProcessRecord:
    """One process that `up` started (a worker or the router)."""

    name: str
    role: str                      # encoder | prefill | decode | colocated | router
    node: str
    host: str
    port: int
    url: str
    pid: int
    pgid: int
    create_time: float             # guards against pid reuse before signalling
    log: str
    since: float
    argv: list[str]
    health_path: str = "/health"
    bootstrap_port: int | None = None
    is_leader: bool = True
    router_id: str | None = None   # smg worker id when registered through POST /workers

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ProcessRecord":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass
class ClusterState:
    """Everything `status`, `logs` and `down` need about a started cluster."""

    name: str
    topology: str
    launcher: str
    phase: str = "starting"       # starting | running | stopping
    created: float = field(default_factory=time.time)
    api_key_env: str | None = None
    model: str | None = None
    processes: list[ProcessRecord] = field(default_factory=list)
    version: int = STATE_VERSION

    @property
    def router(self) -> ProcessRecord | None:
        return next((p for p in self.processes if p.role == "router"), None)

    @property
    def workers(self) -> list[ProcessRecord]:
        return [p for p in self.processes if p.role != "router"]

    def find(self, name: str) -> ProcessRecord | None:
        return next((p for p in self.processes if p.name == name), None)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ClusterState":
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


class ClusterDir:
    """Names every file of one cluster's run folder and reads/writes its state."""

    def __init__(self, name: str, root: Path | None = None):
        self.name = check_name(name)
        self.root = (root or state_root()) / "clusters" / name

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def lock_file(self) -> Path:
        return self.root / "lock"

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    def log(self, worker: str) -> Path:
        return self.log_dir / f"{worker}.log"

    def exists(self) -> bool:
        return self.state_file.exists()

    def load(self) -> ClusterState | None:
        """The recorded state, or None when nothing is recorded; StateError if unreadable."""
        try:
            text = self.state_file.read_text()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StateError(f"cannot read {self.state_file}: {e.strerror}") from e
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ValueError("top level is not an object")
            if data.get("version") != STATE_VERSION:
                raise ValueError(f"unknown state version {data.get('version')!r}")
            return ClusterState.from_dict(data)
        except (ValueError, TypeError, KeyError) as e:
            raise StateError(
                f"cluster state {self.state_file} is corrupt ({e}). Stop any processes it "
                f"listed by hand (see logs in {self.log_dir}), then delete {self.root}"
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
        _refresh_sd(self, state)

    def clear(self) -> None:
        """Forget the state (after `down`); logs stay for later reading."""
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()
        _refresh_sd(self, None)

    @contextlib.contextmanager
    def lock(self, command: str, timeout: float = 0.0) -> Iterator[None]:
        """Hold the cluster's exclusive lock; StateError naming the holder if it is taken."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
                        raise StateError(
                            f"cluster {self.name!r} is busy: another epdctl command holds its "
                            f"lock ({holder or 'unknown holder'}); wait for it to finish"
                        ) from None
                    time.sleep(0.05)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"epdctl {command}, pid {os.getpid()}".encode(), 0)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock


def _refresh_sd(cdir: ClusterDir, state: ClusterState | None) -> None:
    """Keep registered Prometheus SD files in step with the state (see epdctl/prometheus_sd.py)."""
    from epdctl.prometheus_sd import refresh

    refresh(cdir, state)


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
