"""The launcher contract: start, poll and stop MANY processes per call, read one's log.

Every operation takes a batch of ``ProcessRecord`` (the state's one record per process) and
returns a ``Results`` map, Fabric style: each process's result or exception, so one failing
worker never hides the others and one call costs one round trip per node (ssh), one
``squeue`` (slurm) or one process-table scan (local). A launcher returns values and raises
``LaunchError``; it never prints. Every launcher is built the same way::

    launcher = get_launcher(name, cluster_dir, topology, accept_new_host_keys=False)

``topology`` is needed only to start processes (`up`, `rebalance`); `status`, `logs` and `down`
build the launcher from the run folder alone.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Iterator, Mapping, Protocol, Sequence, TypeVar

from epdctl.errors import LaunchError
from epdctl.state.store import Handle, ProcessRecord

if TYPE_CHECKING:
    from epdctl.launchers.streams import NodeJobs
    from epdctl.preflight.runners import NodeRunner

T = TypeVar("T")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# What a worker inherits from the launching shell besides the variables its topology names:
# enough to find programs and libraries, a home, a locale, a temp dir, the proxy-free network.
# The operator's other variables (tokens, cloud credentials ...) never reach a worker.
BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
            "TERM", "SHELL", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "PYTHONPATH", "CUDA_VISIBLE_DEVICES",
            "CUDA_HOME", "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS",
            "SSL_CERT_FILE", "SLURM_CONF")
BASE_ENV_PREFIXES = ("EPDCTL_", "NCCL_", "MC_", "SGLANG_", "VLLM_")
# Every process a launcher starts runs under the supervisor (node/supervise.py) and
# carries these markers in its environment: its identity, which `down` verifies before it
# signals anything and searches for when state.json is damaged or gone.
MARKER_CLUSTER, MARKER_WORKER, MARKER_TOKEN = "EPDCTL_CLUSTER", "EPDCTL_WORKER", "EPDCTL_TOKEN"
SUPERVISOR = ("-m", "epdctl.node.supervise", "--")


@dataclass(frozen=True)
class Status:
    """What ``poll`` saw for one process."""

    alive: bool
    exit_code: int | str | None = None    # when the launcher knows it
    tail: str = ""                       # last lines of the log of a dead process
    restarts: int = 0                    # times the supervisor restarted it
    last_exit: str | None = None         # why its last run ended ("killed by signal 9 ...")
    peek: str | None = None              # last lines of a live process's log where only the
                                         # node can read it (ssh); None: its ``log`` is here


@dataclass(frozen=True)
class Holding:
    """What holds a cluster's processes when it can end by itself (a SLURM allocation), as
    `status` shows it: its id, the scheduler's state, and why it ended."""

    job: str
    state: str          # RUNNING, CANCELLED, TIMEOUT, NODE_FAIL, GONE (forgotten) ...
    detail: str = ""    # "" while it runs; else why it ended, what to change, who ended first
    owned: bool = True  # epdctl submitted it (`down` cancels it); False: adopted ($SLURM_JOB_ID)


@dataclass
class Results(Generic[T]):
    """Per-process outcome of an operation over many processes."""

    ok: dict[str, T] = field(default_factory=dict)
    failed: dict[str, Exception] = field(default_factory=dict)

    @property
    def all_ok(self) -> bool:
        return not self.failed

    def raise_if_failed(self, what: str) -> None:
        """One LaunchError listing every failure as ``[name] reason`` (a single failure that
        already names its ``[node/worker]`` is raised as it is)."""
        if len(self.failed) == 1:
            name, err = next(iter(self.failed.items()))
            if str(err).startswith("["):
                raise LaunchError(str(err))
        if self.failed:
            lines = "\n".join(f"  [{n}] {e}" for n, e in self.failed.items())
            raise LaunchError(f"{what} failed for {len(self.failed)} worker(s):\n{lines}")


class Launcher(Protocol):
    """The seam between the commands and a way to run processes (local, ssh, slurm)."""

    name: str
    runs_here: bool      # processes bind on this machine: their ports can be checked here
    nodes_known: bool    # the nodes exist before anything starts, so `up` can check them
                         # first (False: a SLURM allocation chooses them at start)

    def node_runners(self, nodes: Sequence[str]) -> Mapping[str, "NodeRunner"]:
        """How `check` and `up`'s preflight run the node agent on each of ``nodes``: the way
        this launcher reaches them (same interpreter; over SSH the same options and host-key
        policy, --accept-new-host-keys included). Connecting happens on first use, per node."""
        ...

    def node_jobs(self, nodes: Sequence[str]) -> Mapping[str, "NodeJobs"]:
        """How a program that runs to completion reaches each of ``nodes`` where their workers
        will run (staging weights): this machine, an SSH command over this launcher's
        connections, a step inside the SLURM allocation (obtained now when there is none)."""
        ...

    def start(self, recs: Sequence[ProcessRecord]) -> Results[Handle]:
        """Start every record detached (own process group / own job step), output appended to
        ``rec.log``; one result per record name. The caller stores the handles."""
        ...

    def poll(self, recs: Sequence[ProcessRecord]) -> Results[Status]:
        """Alive or not, per record (a node that cannot be asked is a failure, not 'dead')."""
        ...

    def stop(self, recs: Sequence[ProcessRecord], grace: float = 10.0) -> Results[None]:
        """TERM every process, KILL what is left after ``grace`` seconds, confirm."""
        ...

    def logs(self, rec: ProcessRecord, lines: int = 40) -> str:
        """The last ``lines`` of the process's log, wherever it is written."""
        ...

    def follow(self, rec: ProcessRecord) -> Iterator[str]:
        """New log lines as they come, until the caller stops."""
        ...

    def place(self, text: str) -> str:
        """A planned address (in a URL, a host, a flag) -> where the launcher put it: the
        allocated node's address on SLURM; unchanged for local and ssh."""
        ...

    def holding(self, recs: Sequence[ProcessRecord]) -> Holding | None:
        """The state of what holds the processes (a SLURM allocation: RUNNING, or why it
        ended and which of ``recs`` ended for good first); None when nothing does (local, ssh)."""
        ...

    def release(self) -> None:
        """After `down` stopped every process: give back what `up` acquired (a SLURM
        allocation epdctl submitted). Nothing for local and ssh."""
        ...

    def close(self) -> None:
        """Drop connections (ssh); the cluster keeps running."""
        ...

    def orphans(self) -> list[ProcessRecord]:
        """Processes carrying this cluster's marker, found without the state (for `down` when
        state.json is damaged, emptied or gone); LaunchError when a place cannot be searched."""
        ...


def worker_env(spec_env: Mapping[str, str], where: str,
               source: Mapping[str, str] | None = None, keys: Sequence[str] = ()) -> dict[str, str]:
    """The environment a worker starts with: the documented base set from ``source`` (this
    shell), the API key variables it reads (``keys``: its record's ``key_vars``) and the
    topology's variables, ``${VAR}`` references resolved."""
    source = os.environ if source is None else source
    env = {k: v for k, v in source.items()
           if k in BASE_ENV or k.startswith(BASE_ENV_PREFIXES) or k in keys}
    env.update(expand_env(spec_env, where, source))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def cluster_id(cluster_dir: Path | None) -> str:
    """The value of the EPDCTL_CLUSTER marker: the cluster's name, the machine epdctl runs on
    and its run folder, so two state folders (or machines) with a cluster of the same name
    never claim each other's processes."""
    if cluster_dir is None:
        return ""
    root = Path(cluster_dir).expanduser().absolute()
    return f"{root.name}@{socket.gethostname()}:{root}"


def new_token() -> str:
    return secrets.token_hex(16)


def supervision_env(cluster: str, rec: ProcessRecord, token: str, pid_file: str) -> dict[str, str]:
    """The markers and the supervisor's settings for one process (environment, never argv)."""
    env = {MARKER_CLUSTER: cluster, MARKER_WORKER: rec.name, MARKER_TOKEN: token,
           "EPDCTL_RESTART": json.dumps(rec.restart or {}), "EPDCTL_PID_FILE": pid_file}
    if rec.is_leader and rec.url:
        env["EPDCTL_HEALTH_URL"] = rec.url.rstrip("/") + rec.health_path
    if rec.role == "router":  # restarted with the workers it had (supervise.py)
        env["EPDCTL_ROUTER"] = "1"
    return env


def read_pid_file(path: Path, token: str | None) -> tuple[int, str | None]:
    """(restarts, last exit cause) from the supervisor's pid file, when the file belongs to
    the process with ``token``; (0, None) otherwise."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return 0, None
    if not (isinstance(doc, dict) and token and doc.get("token") == token):
        return 0, None
    n, last = doc.get("restarts"), doc.get("last_exit")
    return (n if isinstance(n, int) else 0), (last if isinstance(last, str) else None)


def by_name(recs: Sequence[ProcessRecord]) -> dict[str, ProcessRecord]:
    return {r.name: r for r in recs}


def expand_env(env: Mapping[str, str], where: str, source: Mapping[str, str] | None = None
               ) -> dict[str, str]:
    """Resolve ``${VAR}`` references from the caller's environment at launch time.

    Plans never hold secret values; they are filled in here and never written anywhere.
    """
    source = os.environ if source is None else source
    out: dict[str, str] = {}
    for key, value in env.items():
        def sub(m: re.Match[str]) -> str:
            var = m.group(1)
            if var not in source:
                raise LaunchError(
                    f"[{where}] environment variable {var} (used by {key}) is not set; "
                    f"export it before running epdctl"
                )
            return source[var]
        out[key] = _VAR.sub(sub, str(value))
    return out


def expand_argv(argv: list[str], where: str) -> list[str]:
    """Expand ``${VAR}`` references inside command-line items (same rules as env)."""
    named = {f"argument {i}": a for i, a in enumerate(argv)}
    return list(expand_env(named, where).values())


def tail(path: Path, n: int = 20) -> str:
    """The last ``n`` lines of a log file ('' when it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read()
    except FileNotFoundError:
        return ""
    lines = data.decode(errors="replace").splitlines()
    return "\n".join(lines[-n:]) if n > 0 else ""


def follow_file(path: Path, interval: float = 0.3) -> Iterator[str]:
    """New lines appended to ``path`` (from its current end), forever."""
    pos = path.stat().st_size if path.exists() else 0
    while True:
        try:
            with open(path, "rb") as f:
                f.seek(pos)
                chunk = f.read()
        except FileNotFoundError:
            chunk = b""
        if chunk:
            pos += len(chunk)
            yield from chunk.decode(errors="replace").splitlines()
        time.sleep(interval)
