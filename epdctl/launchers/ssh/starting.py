"""Starting workers over SSH: prepare every node (connect, setup lines, the epdctl version
gate, the run folder), then one agent call per node starts that node's workers, detached,
under the supervisor, with their environment and identity markers sent on stdin.

Why the version gate: the workers need torch and the runtime on the node, which no shipped
zipapp could carry, so a node whose epdctl differs is refused with both versions rather than
papered over. A ``NodeStarter`` remembers which nodes passed it; it reaches the nodes through
the ``Nodes`` it is given (the SSH launcher).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

import epdctl
from epdctl.errors import LaunchError
from epdctl.launchers.base import Results, cluster_id, new_token, supervision_env
from epdctl.launchers.ssh.fanout import fanout, raise_if_failed
from epdctl.launchers.ssh.nodes import NodeAccess, expand_local
from epdctl.node import supervise
from epdctl.state.store import Handle, ProcessRecord

SUPERVISOR_SOURCE = Path(supervise.__file__).read_text()


class Nodes(Protocol):
    """What starting needs of a cluster's nodes: reach them, name their run folders, mirror logs."""

    nodes: dict[str, NodeAccess]
    cluster_dir: Path | None
    api_key_env: str | None

    def agent(self, node: str, req: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]: ...
    def access(self, node: str) -> NodeAccess: ...
    def remote_dir(self, node: str) -> str: ...
    def bind_to_log(self, local_log: Path | None) -> None: ...
    def write_mirror(self, rec: ProcessRecord, text: str) -> None: ...


class NodeStarter:
    """Prepares nodes once each and starts workers on them, one agent call per node."""

    def __init__(self, nodes: Nodes, settle: float = 0.5, parallel: bool = True):
        self.on = nodes
        self.settle = settle
        self.parallel = parallel
        self.prepared: dict[str, dict[str, Any]] = {}

    def prepare_node(self, node: str) -> dict[str, Any]:
        """Connect, run setup lines, check the node's epdctl version, create the run folder."""
        if node in self.prepared:
            return self.prepared[node]
        info = self.on.agent(node, {"op": "prepare", "dir": self.on.remote_dir(node)})
        mine = epdctl.__version__
        if info.get("version") is None:
            raise LaunchError(f"[{node}] epdctl is not importable by {info.get('python')} on the "
                              f"node ({info.get('problem')}); install epdctl {mine} there, or point "
                              f"the topology's python / the node's setup lines at it")
        if info["version"] != mine:
            raise LaunchError(f"[{node}] epdctl version mismatch: the node has {info['version']} "
                              f"({info.get('python')}), this machine has {mine}; install epdctl "
                              f"{mine} on the node (or run this epdctl's version here)")
        self.prepared[node] = info
        return info

    def prepare(self, nodes: Iterable[str] | None = None) -> Results[dict[str, Any]]:
        """``prepare_node`` on every node at once; a per-node Results map."""
        wanted = list(nodes) if nodes is not None else list(self.on.nodes)
        return fanout({n: n for n in wanted}, lambda n, _: self.prepare_node(n),
                      parallel=self.parallel)

    def wire(self, rec: ProcessRecord) -> dict[str, Any]:
        acc = self.on.access(rec.node)
        env = expand_local({**acc.env, **rec.env})
        names = list(rec.key_vars)  # the router wrapper's and embedded workers' --api-key-env
        if rec.role == "router" and self.on.api_key_env:
            names.append(self.on.api_key_env)
        for name in names:
            if name in os.environ:
                env[name] = os.environ[name]  # travels on stdin only
        # markers and supervisor settings; the agent sets the pid file beside the record
        env.update(supervision_env(cluster_id(self.on.cluster_dir), rec, new_token(), ""))
        return {"name": rec.name, "argv": list(rec.argv), "env": env,
                "ports": list(rec.ports.values())}

    def start_on_node(self, node: str, recs: list[ProcessRecord]) -> dict[str, Handle | Exception]:
        self.prepare_node(node)
        ans = self.on.agent(node, {"op": "start", "dir": self.on.remote_dir(node),
                                   "workers": [self.wire(r) for r in recs],
                                   "supervisor": SUPERVISOR_SOURCE,
                                   "settle": self.settle, "lines": 20})
        out: dict[str, Handle | Exception] = {}
        for r in recs:
            got = ans["workers"][r.name]
            if "error" in got:
                out[r.name] = LaunchError(f"[{node}/{r.name}] {got['error']}")
            elif not got.get("alive", True):
                self.on.write_mirror(r, got.get("tail", ""))
                out[r.name] = LaunchError(
                    f"[{node}/{r.name}] exited with status {got.get('rc')} right after start; "
                    f"last lines of {got['log']} on {node}:\n{got.get('tail', '')}")
            else:
                out[r.name] = Handle(pid=int(got["pid"]), pgid=int(got["pgid"]),
                                     create_time=float(got["create_time"]),
                                     token=got.get("token"))
        return out

    def start(self, recs: Sequence[ProcessRecord]) -> Results[Handle]:
        """Start many workers, one SSH command per node, nodes in parallel; per worker.

        Every node of the cluster is prepared (version check) on the first call; when one
        cannot be, nothing starts and LaunchError lists every bad node and the fine ones."""
        recs = list(recs)
        res: Results[Handle] = Results()
        if not recs:
            return res
        self.on.bind_to_log(Path(recs[0].log))
        if not self.prepared:  # every bad node reported before anything starts anywhere
            raise_if_failed(self.prepare(), "preparing the nodes")
        by_node = group_by_node(recs)
        per_node = fanout(by_node, self.start_on_node, parallel=self.parallel)
        for node, group in by_node.items():
            for r in group:
                got = per_node.ok[node][r.name] if node in per_node.ok else per_node.failed[node]
                if isinstance(got, Exception):
                    res.failed[r.name] = got
                else:
                    res.ok[r.name] = got
        return res


def group_by_node(recs: Sequence[ProcessRecord]) -> dict[str, list[ProcessRecord]]:
    by_node: dict[str, list[ProcessRecord]] = {}
    for r in recs:
        by_node.setdefault(r.node, []).append(r)
    return by_node
