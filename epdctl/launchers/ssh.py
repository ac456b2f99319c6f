"""Run workers on other machines over SSH (the ``ssh`` launcher).

Per node, every operation is one SSH command: the topology's setup lines, then the node's
python reading ``ssh_agent.py`` from stdin (see there for why). Nodes are handled in parallel
(``epdctl.fanout``) and one node's failure never hides another's.

Why a version check and not a shipped zipapp: the workers need torch, transformers and the
rest of the runtime on the node, which no zipapp can carry, so the node must have epdctl
installed anyway. The launcher refuses a node whose ``epdctl.__version__`` differs from the
local one (message names the node, its python and both versions) instead of running a
command line the node's epdctl may not understand.

Where things live: on the node, ``<run_root>/<cluster>/<node>/<worker>.{log,json}`` (the JSON
records pid, process group, start time, log path and ports, so the node itself knows what
epdctl started). Locally, handles carry the path of a mirror of the remote log under the
cluster's run folder (``clusters/<name>/logs/<worker>.log``), refreshed with the remote tail
whenever epdctl finds a worker dead, reads its log or stops it; next to it, ``ssh-nodes.json``
holds how to reach each node (addresses, user, key *path*, jump, setup lines; no secrets) so
that `status` and `down` from another shell need neither the topology nor its old location.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import epdctl
from epdctl.errors import LaunchError
from epdctl.fanout import fanout, raise_if_failed
from epdctl.launchers import ssh_agent
from epdctl.launchers.base import Handle, LaunchSpec, Results
from epdctl.sshconn import (ConnectionPool, SSHOptions, SSHTarget, default_known_hosts,
                            parse_destination)

log = logging.getLogger(__name__)
DEFAULT_RUN_ROOT = "~/.epdctl/nodes"
NODES_FILE = "ssh-nodes.json"
MIRROR_LINES = 200  # lines of each remote log kept locally after `down` (for `epdctl logs`)
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_AGENT_SOURCE = Path(ssh_agent.__file__).read_text()


@dataclass(frozen=True)
class NodeAccess:
    """How to reach one node and prepare its shell (no secrets: the key is a path)."""

    node: str
    target: SSHTarget
    setup: tuple[str, ...] = ()
    python: str = "python3"
    env: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "target": asdict(self.target), "setup": list(self.setup),
                "python": self.python, "env": dict(self.env)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "NodeAccess":
        def target(t: dict[str, Any] | None) -> SSHTarget | None:
            if t is None:
                return None
            return SSHTarget(**{**t, "jump": target(t.get("jump"))})

        return cls(node=d["node"], target=target(d["target"]),  # type: ignore[arg-type]
                   setup=tuple(d.get("setup", ())), python=d.get("python", "python3"),
                   env=dict(d.get("env", {})))


def nodes_from_topology(topo: Any) -> dict[str, NodeAccess]:
    """Node name -> NodeAccess. ``ssh.jump`` may name another node or be [user@]host[:port]."""
    by_name = {n.name: n for n in topo.nodes}

    def target(n: Any, seen: tuple[str, ...]) -> SSHTarget:
        ssh = n.ssh
        jump = None
        if ssh.jump:
            if ssh.jump in by_name:
                if ssh.jump in seen:
                    raise LaunchError(f"[{n.name}] ssh.jump loops back to {ssh.jump}")
                jump = target(by_name[ssh.jump], seen + (n.name,))
            else:
                jump = parse_destination(ssh.jump, n.name)
        port = ssh.port if ssh.port != 22 else None  # 22 is the schema default: let ssh config decide
        return SSHTarget(node=n.name, host=n.host, user=ssh.user, port=port, key=ssh.key, jump=jump)

    python = getattr(topo, "python", "python3") or "python3"
    return {n.name: NodeAccess(n.name, target(n, ()), tuple(n.setup), python, dict(n.env))
            for n in topo.nodes}


def _options_from_env(accept_new: bool | None) -> SSHOptions:
    """Defaults, adjustable without a CLI flag: EPDCTL_KNOWN_HOSTS, EPDCTL_SSH_CONFIG (empty:
    read none), EPDCTL_SSH_ACCEPT_NEW_HOST_KEYS=1, EPDCTL_SSH_TIMEOUT (seconds); the node run
    folder root comes from EPDCTL_SSH_RUN_ROOT."""
    if accept_new is None:
        accept_new = os.environ.get("EPDCTL_SSH_ACCEPT_NEW_HOST_KEYS", "") in ("1", "true", "yes")
    cfg = os.environ.get("EPDCTL_SSH_CONFIG", "~/.ssh/config")
    return SSHOptions(known_hosts=default_known_hosts(), accept_new_host_keys=accept_new,
                      connect_timeout=float(os.environ.get("EPDCTL_SSH_TIMEOUT", "10")),
                      ssh_config=cfg or None)


def _expand_local(env: Mapping[str, str]) -> dict[str, str]:
    """Fill ``${VAR}`` from this machine where set; the rest is resolved on the node."""
    return {k: _VAR.sub(lambda m: os.environ.get(m.group(1), m.group(0)), str(v))
            for k, v in env.items()}


def _ports(argv: Iterable[str]) -> list[int]:
    args = list(argv)
    return [int(v) for f, v in zip(args, args[1:]) if f.endswith("port") and v.isdigit()]


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
        self.options = options or _options_from_env(accept_new_host_keys)
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
        nodes_file = cdir / NODES_FILE
        if self.nodes:
            (cdir / "logs").mkdir(parents=True, exist_ok=True)  # mirrors land here
            doc = {"cluster": self.cluster, "run_root": self.run_root,
                   "api_key_env": self.api_key_env,
                   "nodes": [n.to_dict() for n in self.nodes.values()]}
            tmp = nodes_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc, indent=2))
            os.replace(tmp, nodes_file)
            return
        if nodes_file.is_file():
            doc = json.loads(nodes_file.read_text())
            self.run_root = doc.get("run_root", self.run_root)
            self.api_key_env = self.api_key_env or doc.get("api_key_env")
            self.nodes = {d["node"]: NodeAccess.from_dict(d) for d in doc["nodes"]}
            return
        state = cdir / "state.json"
        if state.is_file():
            from epdctl.topology import load_topology  # only when the node list is missing

            topo = load_topology(Path(json.loads(state.read_text())["topology"]))
            self.nodes = nodes_from_topology(topo)
            if topo.router is not None:
                self.api_key_env = self.api_key_env or topo.router.api_key_env
            self._bind(cdir)
            return
        raise LaunchError(f"the ssh launcher cannot tell how to reach the nodes of cluster "
                          f"{cdir.name!r}: neither {nodes_file} nor {state} exists")

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
        """Run the agent on ``node`` after its setup lines; its JSON answer."""
        acc = self._access(node)
        lines = ["set -e"]
        if acc.setup:
            lines += ["{", *acc.setup, "} </dev/null"]
        lines.append(f"exec {shlex.quote(acc.python)} -")
        program = f"{_AGENT_SOURCE}\n_main(json.loads({json.dumps(json.dumps(req))}))\n"
        res = self.pool.get(acc.target).run("\n".join(lines), stdin=program, timeout=timeout)
        for line in reversed(res.stdout.splitlines()):
            if line.startswith(ssh_agent.MARK):
                answer = json.loads(line[len(ssh_agent.MARK):])
                if "error" in answer and len(answer) == 1:
                    raise LaunchError(f"[{node}] {req['op']} failed on the node: {answer['error']}")
                return answer
        err = "\n".join(res.stderr.strip().splitlines()[-10:]) or "(no output)"
        if res.rc == 127:
            raise LaunchError(f"[{node}] {acc.python!r} or a setup command was not found on the "
                              f"node (exit 127): {err}. Fix the topology's python or the node's "
                              f"setup lines")
        what = "its setup lines" if acc.setup else "the node's shell"
        raise LaunchError(f"[{node}] {what} failed (exit {res.rc}) before epdctl could run "
                          f"there: {err}")

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
        env = _expand_local({**acc.env, **spec.env})
        if spec.role == "router" and self.api_key_env and self.api_key_env in os.environ:
            env[self.api_key_env] = os.environ[self.api_key_env]  # travels on stdin only
        return {"name": spec.name, "argv": list(spec.argv), "env": env,
                "ports": _ports(spec.argv)}

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

    def follow(self, handle: Handle, lines: int = 0) -> Iterator[str]:
        """New lines of the remote log as they come (``tail -F``), until the caller stops."""
        self._context(handle.log)
        acc = self._access(handle.node)
        path = self.remote_log(handle)
        if path.startswith("~/"):
            path = "$HOME/" + shlex.quote(path[2:])
        else:
            path = shlex.quote(path)
        out = self.pool.get(acc.target).stream(f"exec tail -n {int(lines)} -F {path}")
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


def with_overrides(access: NodeAccess, **changes: Any) -> NodeAccess:
    """A copy of ``access`` with target fields replaced (tests, benchmarks)."""
    return replace(access, target=replace(access.target, **changes))
