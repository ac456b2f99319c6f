"""Run workers on other machines over SSH (the ``ssh`` launcher); see docs/ssh.md.

Per node, every operation is one SSH command running the agent (``ssh_agent.py``) after the
node's setup lines; nodes are handled in parallel (``epdctl.fanout``) and one node's failure
never hides another's. Before the first start, every node's epdctl version must equal the
local one: the workers need torch and the runtime on the node, which no shipped zipapp could
carry, so a mismatch is refused with both versions rather than papered over.

On the node, ``<run_root>/<cluster>/<node>/<worker>.{log,json}`` records what was started
(pid, process group, start time, log, ports). Locally, a handle's ``log`` is a mirror under
``clusters/<name>/logs/`` refreshed with the remote tail whenever epdctl finds the worker
dead, reads its log or stops it, so commands written for local files still show it.
"""

from __future__ import annotations

import logging
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import epdctl
from epdctl.errors import LaunchError
from epdctl.fanout import fanout, raise_if_failed
from epdctl.launchers.base import Handle, LaunchSpec, Results
from epdctl.launchers.ssh_nodes import (NodeAccess, expand_local, load_nodes, nodes_from_topology,
                                        options_from_env, ports_of, run_agent, save_nodes)
from epdctl.sshconn import ConnectionPool, SSHOptions

log = logging.getLogger(__name__)
_options_from_env = options_from_env  # the name epdctl.preflight.targets imports
DEFAULT_RUN_ROOT = "~/.epdctl/nodes"
MIRROR_LINES = 200  # lines of each remote log kept locally after `down` (for `epdctl logs`)


@dataclass(frozen=True)
class WorkerState:
    """What `poll` saw for one worker on its node."""

    alive: bool
    tail: str = ""


class SSHLauncher:
    """Start, watch and stop workers on remote nodes; implements the Launcher protocol.

    Built either explicitly (``topology`` or ``nodes``, and ``cluster_dir``) or with no arguments, as
    the commands do: then the cluster is found from the first handle's log path, and its
    nodes from ``ssh-nodes.json`` there (or from the topology that ``state.json`` names).
    """

    name = "ssh"

    def __init__(self, topology: Any = None, *, nodes: Mapping[str, NodeAccess] | None = None,
                 cluster: str | None = None, cluster_dir: Path | None = None,
                 options: SSHOptions | None = None, accept_new_host_keys: bool | None = None,
                 run_root: str | None = None, settle: float = 0.5, parallel: bool = True,
                 api_key_env: str | None = None):
        self.options = options or options_from_env(accept_new_host_keys)
        self.run_root = run_root or os.environ.get("EPDCTL_SSH_RUN_ROOT") or DEFAULT_RUN_ROOT
        self.settle = settle
        self.parallel = parallel
        self.pool = ConnectionPool(self.options)
        self.cluster_dir = Path(cluster_dir) if cluster_dir else None
        self.cluster: str | None = cluster or getattr(topology, "name", None)
        self.api_key_env = api_key_env
        if topology is not None and getattr(topology, "router", None) is not None:
            self.api_key_env = self.api_key_env or topology.router.api_key_env
        self.nodes: dict[str, NodeAccess] = dict(nodes) if nodes else (
            nodes_from_topology(topology) if topology is not None else {})
        self._prepared: dict[str, dict[str, Any]] = {}
        if self.cluster_dir is not None:
            self._bind(self.cluster_dir)

    # ---- cluster context -------------------------------------------------------------

    def _bind(self, cdir: Path) -> None:
        """Attach to the cluster folder: write the node list there, or read it back."""
        self.cluster_dir = cdir
        self.cluster = self.cluster or cdir.name
        if not self.nodes:
            doc = load_nodes(cdir)
            self.nodes = doc["nodes"]
            self.api_key_env = self.api_key_env or doc.get("api_key_env")
            if "run_root" in doc:  # read back as written: nothing to save
                self.run_root = doc["run_root"]
                return
        save_nodes(cdir, {"cluster": self.cluster, "run_root": self.run_root,
                          "api_key_env": self.api_key_env,
                          "nodes": [n.to_dict() for n in self.nodes.values()]})

    def _context(self, local_log: Path | None) -> None:
        if self.nodes and self.cluster:
            return
        if local_log is not None and local_log.parent.name == "logs":
            self._bind(local_log.parent.parent)
            return
        raise LaunchError("the ssh launcher needs the topology or the cluster's run folder")

    def _access(self, node: str) -> NodeAccess:
        try:
            return self.nodes[node]
        except KeyError:
            raise LaunchError(f"[{node}] is not a node of cluster {self.cluster!r} "
                              f"(known: {', '.join(self.nodes) or 'none'})") from None

    def remote_dir(self, node: str) -> str:
        return f"{self.run_root.rstrip('/')}/{self.cluster}/{node}"

    def remote_log(self, handle: Handle) -> str:
        return f"{self.remote_dir(handle.node)}/{handle.name}.log"

    def _local_log(self, name: str, node: str) -> Path:
        """The handle's log: the local mirror, or the remote path without a run folder."""
        if self.cluster_dir is None:
            return Path(f"{self.remote_dir(node)}/{name}.log")
        return self.cluster_dir / "logs" / f"{name}.log"

    # ---- one node --------------------------------------------------------------------

    def _agent(self, node: str, req: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
        acc = self._access(node)
        return run_agent(self.pool.get(acc.target), acc, req, timeout)

    def prepare_node(self, node: str) -> dict[str, Any]:
        """Connect, run setup lines, check the node's epdctl version, create the run folder."""
        if node in self._prepared:
            return self._prepared[node]
        info = self._agent(node, {"op": "prepare", "dir": self.remote_dir(node)})
        mine = epdctl.__version__
        if info.get("version") is None:
            raise LaunchError(f"[{node}] epdctl is not importable by {info.get('python')} on the "
                              f"node ({info.get('problem')}); install epdctl {mine} there, or point "
                              f"the topology's python / the node's setup lines at it")
        if info["version"] != mine:
            raise LaunchError(f"[{node}] epdctl version mismatch: the node has {info['version']} "
                              f"({info.get('python')}), this machine has {mine}; install epdctl "
                              f"{mine} on the node (or run this epdctl's version here)")
        self._prepared[node] = info
        return info

    def prepare(self, nodes: Iterable[str] | None = None) -> Results[dict[str, Any]]:
        """``prepare_node`` on every node at once; a per-node Results map."""
        wanted = list(nodes) if nodes is not None else list(self.nodes)
        return fanout({n: n for n in wanted}, lambda n, _: self.prepare_node(n),
                      parallel=self.parallel)

    def _wire(self, spec: LaunchSpec) -> dict[str, Any]:
        acc = self._access(spec.node)
        env = expand_local({**acc.env, **spec.env})
        if spec.role == "router" and self.api_key_env and self.api_key_env in os.environ:
            env[self.api_key_env] = os.environ[self.api_key_env]  # travels on stdin only
        return {"name": spec.name, "argv": list(spec.argv), "env": env,
                "ports": ports_of(spec.argv)}

    def _handle(self, spec: LaunchSpec, rec: dict[str, Any]) -> Handle:
        return Handle(name=spec.name, role=spec.role, node=spec.node, pid=int(rec["pid"]),
                      pgid=int(rec["pgid"]), create_time=float(rec["create_time"]),
                      log=self._local_log(spec.name, spec.node), since=float(rec["since"]),
                      argv=tuple(spec.argv))

    def start_on_node(self, node: str, specs: list[LaunchSpec]) -> dict[str, Handle | Exception]:
        self.prepare_node(node)
        ans = self._agent(node, {"op": "start", "dir": self.remote_dir(node),
                                 "workers": [self._wire(s) for s in specs],
                                 "settle": self.settle, "lines": 20})
        out: dict[str, Handle | Exception] = {}
        for s in specs:
            rec = ans["workers"][s.name]
            if "error" in rec:
                out[s.name] = LaunchError(f"[{node}/{s.name}] {rec['error']}")
            elif not rec.get("alive", True):
                self._write_mirror(s.name, rec.get("tail", ""))
                out[s.name] = LaunchError(
                    f"[{node}/{s.name}] exited with status {rec.get('rc')} right after start; "
                    f"last lines of {rec['log']} on {node}:\n{rec.get('tail', '')}")
            else:
                out[s.name] = self._handle(s, rec)
        return out

    # ---- Launcher protocol -----------------------------------------------------------

    def start(self, spec: LaunchSpec, log: Path) -> Handle:
        """Start one worker detached on its node (all nodes are prepared on the first call)."""
        self._context(log)
        if not self._prepared:
            raise_if_failed(self.prepare(), "preparing the nodes")
        got = self.start_on_node(spec.node, [spec])[spec.name]
        if isinstance(got, Exception):
            raise got
        return got

    def start_many(self, specs: Iterable[LaunchSpec]) -> Results[Handle]:
        """Start many workers, one SSH command per node, nodes in parallel; per worker."""
        by_node: dict[str, list[LaunchSpec]] = {}
        for s in specs:
            by_node.setdefault(s.node, []).append(s)
        per_node = fanout(by_node, self.start_on_node, parallel=self.parallel)
        res: Results[Handle] = Results()
        for node, group in by_node.items():
            for s in group:
                got = per_node.ok[node][s.name] if node in per_node.ok else per_node.failed[node]
                if isinstance(got, Exception):
                    res.failed[s.name] = got
                else:
                    res.ok[s.name] = got
        return res

    def poll(self, handles: Iterable[Handle], lines: int = 20) -> Results[WorkerState]:
        """Alive (same pid and start time) per worker, with the log tail of dead ones."""
        handles = list(handles)
        self._context(handles[0].log if handles else None)
        by_node = self._group(handles)
        per_node = fanout(by_node, lambda n, hs: self._agent(n, {
            "op": "poll", "lines": lines,
            "workers": [self._rec(h) for h in hs]})["workers"], parallel=self.parallel)
        res: Results[WorkerState] = Results()
        for node, hs in by_node.items():
            for h in hs:
                if node in per_node.failed:
                    res.failed[h.name] = per_node.failed[node]
                    continue
                st = per_node.ok[node][h.name]
                if not st["alive"]:
                    self._write_mirror(h.name, st.get("tail", ""))
                res.ok[h.name] = WorkerState(st["alive"], st.get("tail", ""))
        return res

    def is_alive(self, handle: Handle) -> bool:
        """One worker's leader is running and is the process we started (pid reuse guard).

        Raises LaunchError when the node cannot be asked (unknown is not dead).
        """
        got = self.poll([handle])
        got.raise_if_failed(f"checking {handle.name}")
        return got.ok[handle.name].alive

    def stop(self, handles: Iterable[Handle], grace: float = 10.0) -> Results[None]:
        """TERM exactly the recorded process groups on every node, KILL after ``grace``.

        The last lines of every log are copied into the local mirror on the way out.
        """
        handles = list(handles)
        res: Results[None] = Results()
        if not handles:
            return res
        self._context(handles[0].log)
        by_node = self._group(handles)
        per_node = fanout(by_node, lambda n, hs: self._agent(n, {
            "op": "stop", "grace": grace, "workers": [self._rec(h) for h in hs],
            "lines": MIRROR_LINES}, timeout=grace + 60)["workers"], parallel=self.parallel)
        for node, hs in by_node.items():
            for h in hs:
                if node in per_node.failed:
                    res.failed[h.name] = per_node.failed[node]
                    continue
                self._write_mirror(h.name, per_node.ok[node][h.name].get("tail", ""))
                if "error" in per_node.ok[node][h.name]:
                    res.failed[h.name] = LaunchError(
                        f"[{node}/{h.name}] {per_node.ok[node][h.name]['error']}")
                else:
                    res.ok[h.name] = None
        return res

    # ---- logs ------------------------------------------------------------------------

    def tail(self, handle: Handle, lines: int = 40) -> str:
        """The last ``lines`` of the worker's log on its node (also refreshes the mirror)."""
        self._context(handle.log)
        ans = self._agent(handle.node, {"op": "tail", "log": self.remote_log(handle),
                                        "lines": lines})
        self._write_mirror(handle.name, ans["text"])
        return ans["text"]

    def follow(self, handle: Handle, lines: int = 0,
               idle_timeout: float | None = None) -> Iterator[str]:
        """New lines of the remote log as they come (``tail -F``), until the caller stops
        (or ``idle_timeout`` seconds pass without a line: socket.timeout)."""
        self._context(handle.log)
        acc = self._access(handle.node)
        path = self.remote_log(handle)
        if path.startswith("~/"):
            path = "$HOME/" + shlex.quote(path[2:])
        else:
            path = shlex.quote(path)
        out = self.pool.get(acc.target).stream(f"exec tail -n {int(lines)} -F {path}",
                                               idle_timeout)
        for raw in out:
            yield raw.rstrip("\n") if isinstance(raw, str) else raw.decode().rstrip("\n")

    def records(self, node: str) -> list[dict[str, Any]]:
        """What the node's run folder says epdctl started there (and has not stopped)."""
        return self._agent(node, {"op": "records", "dir": self.remote_dir(node)})["records"]

    def close(self) -> None:
        self.pool.close()

    # ---- helpers ---------------------------------------------------------------------

    def _group(self, handles: list[Handle]) -> dict[str, list[Handle]]:
        by_node: dict[str, list[Handle]] = {}
        for h in handles:
            by_node.setdefault(h.node, []).append(h)
        return by_node

    def _rec(self, h: Handle) -> dict[str, Any]:
        return {"name": h.name, "pid": h.pid, "pgid": h.pgid, "create_time": h.create_time,
                "log": self.remote_log(h)}

    def _write_mirror(self, name: str, text: str) -> None:
        if self.cluster_dir is None:
            return
        path = self.cluster_dir / "logs" / f"{name}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"=== epdctl: last lines of the remote log, fetched "
                        f"{time.strftime('%Y-%m-%d %H:%M:%S')} ===\n{text}\n")

    def __enter__(self) -> "SSHLauncher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
