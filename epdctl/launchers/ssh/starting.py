"""Starting workers over SSH: prepare every node (connect, setup lines, the epdctl version
gate, the run folder), then one agent call per node starts that node's workers, detached,
under the supervisor, with their environment and identity markers sent on stdin.

Why the version gate: the workers need torch and the runtime on the node, which no shipped
zipapp could carry, so a node whose epdctl differs is refused with both versions rather than
papered over. Functions over an ``SSHLauncher`` (its nodes, pool and run folder).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import epdctl
from epdctl.errors import LaunchError
from epdctl.launchers.base import Results, cluster_id, key_vars, new_token, supervision_env
from epdctl.launchers.ssh.fanout import fanout, raise_if_failed
from epdctl.launchers.ssh.nodes import expand_local, ports_of
from epdctl.state import Handle, ProcessRecord

if TYPE_CHECKING:
    from epdctl.launchers.ssh.launcher import SSHLauncher

SUPERVISOR_SOURCE = (Path(__file__).parents[1] / "supervise.py").read_text()


def prepare_node(lau: "SSHLauncher", node: str) -> dict[str, Any]:
    """Connect, run setup lines, check the node's epdctl version, create the run folder."""
    if node in lau._prepared:
        return lau._prepared[node]
    info = lau._agent(node, {"op": "prepare", "dir": lau.remote_dir(node)})
    mine = epdctl.__version__
    if info.get("version") is None:
        raise LaunchError(f"[{node}] epdctl is not importable by {info.get('python')} on the "
                          f"node ({info.get('problem')}); install epdctl {mine} there, or point "
                          f"the topology's python / the node's setup lines at it")
    if info["version"] != mine:
        raise LaunchError(f"[{node}] epdctl version mismatch: the node has {info['version']} "
                          f"({info.get('python')}), this machine has {mine}; install epdctl "
                          f"{mine} on the node (or run this epdctl's version here)")
    lau._prepared[node] = info
    return info

def prepare(lau: "SSHLauncher", nodes: Iterable[str] | None = None) -> Results[dict[str, Any]]:
    """``prepare_node`` on every node at once; a per-node Results map."""
    wanted = list(nodes) if nodes is not None else list(lau.nodes)
    return fanout({n: n for n in wanted}, lambda n, _: lau.prepare_node(n),
                  parallel=lau.parallel)

def wire(lau: "SSHLauncher", rec: ProcessRecord) -> dict[str, Any]:
    acc = lau._access(rec.node)
    env = expand_local({**acc.env, **rec.env})
    names = key_vars(rec.argv)  # the router wrapper's and embedded workers' --api-key-env
    if rec.role == "router" and lau.api_key_env:
        names.append(lau.api_key_env)
    for name in names:
        if name in os.environ:
            env[name] = os.environ[name]  # travels on stdin only
    # markers and supervisor settings; the agent sets the pid file beside the record
    env.update(supervision_env(cluster_id(lau.cluster_dir), rec, new_token(), ""))
    return {"name": rec.name, "argv": list(rec.argv), "env": env,
            "ports": ports_of(rec.argv)}

def start_on_node(lau: "SSHLauncher", node: str, recs: list[ProcessRecord]) -> dict[str, Handle | Exception]:
    lau.prepare_node(node)
    ans = lau._agent(node, {"op": "start", "dir": lau.remote_dir(node),
                             "workers": [wire(lau, r) for r in recs],
                             "supervisor": SUPERVISOR_SOURCE,
                             "settle": lau.settle, "lines": 20})
    out: dict[str, Handle | Exception] = {}
    for r in recs:
        got = ans["workers"][r.name]
        if "error" in got:
            out[r.name] = LaunchError(f"[{node}/{r.name}] {got['error']}")
        elif not got.get("alive", True):
            lau._write_mirror(r, got.get("tail", ""))
            out[r.name] = LaunchError(
                f"[{node}/{r.name}] exited with status {got.get('rc')} right after start; "
                f"last lines of {got['log']} on {node}:\n{got.get('tail', '')}")
        else:
            out[r.name] = Handle(pid=int(got["pid"]), pgid=int(got["pgid"]),
                                 create_time=float(got["create_time"]),
                                 token=got.get("token"))
    return out

def start(lau: "SSHLauncher", recs: Sequence[ProcessRecord]) -> Results[Handle]:
    """Start many workers, one SSH command per node, nodes in parallel; per worker.

    Every node of the cluster is prepared (version check) on the first call; when one
    cannot be, nothing starts and LaunchError lists every bad node and the fine ones."""
    recs = list(recs)
    res: Results[Handle] = Results()
    if not recs:
        return res
    lau._context(Path(recs[0].log))
    if not lau._prepared:  # every bad node reported before anything starts anywhere
        raise_if_failed(lau.prepare(), "preparing the nodes")
    by_node = lau._group(recs)
    per_node = fanout(by_node, lau.start_on_node, parallel=lau.parallel)
    for node, group in by_node.items():
        for r in group:
            got = per_node.ok[node][r.name] if node in per_node.ok else per_node.failed[node]
            if isinstance(got, Exception):
                res.failed[r.name] = got
            else:
                res.ok[r.name] = got
    return res
