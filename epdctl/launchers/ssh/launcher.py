"""Run workers on other machines over SSH (the ``ssh`` launcher); see docs/ssh.md.

Per node, one connection and one agent (``epdctl/node/ssh_agent.py``, started after the node's setup
lines: ``agent_session.py``) serve every operation; nodes are handled in parallel (``epdctl.launchers.ssh.fanout``) and one node's failure
never hides another's. Starting (the version gate included) is a ``NodeStarter`` (``starting.py``).

On the node, ``<run_root>/<cluster>/<node>/<worker>.{log,json}`` records what was started
(pid, process group, start time, log, ports). Locally, a handle's ``log`` is a mirror under
``clusters/<name>/logs/`` refreshed with the remote tail whenever epdctl finds the worker
dead, reads its log or stops it, so commands written for local files still show it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from epdctl.errors import LaunchError
from epdctl.launchers import containers
from epdctl.launchers.base import Results, Status, cluster_id
from epdctl.launchers.ssh.starting import NodeStarter, group_by_node
from epdctl.launchers.ssh.conn import ConnectionPool, SSHOptions
from epdctl.launchers.ssh.fanout import fanout, raise_if_failed
from epdctl.launchers.ssh.agent_session import AgentSession
from epdctl.launchers.ssh.nodes import (NodeAccess, load_nodes, nodes_from_topology,
                                        options_from_env, save_nodes)
from epdctl.state.store import Handle, ProcessRecord
from epdctl.launchers.ssh.runners import ssh_runners

log = logging.getLogger(__name__)
DEFAULT_RUN_ROOT = "~/.epdctl/nodes"
PEEK_LINES = 12  # last lines of each starting worker's log in a poll: what it is doing
MIRROR_LINES = 200  # lines of each remote log kept locally after `down` (for `epdctl logs`)


class SSHLauncher:
    """The launcher contract over SSH. With a topology (`up`, `rebalance`) the node list is
    written to ``ssh-nodes.json`` in the run folder; without one it is read back from there."""

    name = "ssh"
    runs_here = False
    nodes_known = True

    def __init__(self, cluster_dir: Path | None = None, topology: Any = None,
                 accept_new_host_keys: bool = False, *,
                 nodes: Mapping[str, NodeAccess] | None = None, cluster: str | None = None,
                 options: SSHOptions | None = None, run_root: str | None = None,
                 settle: float = 0.5, parallel: bool = True):
        """The contract's three arguments; the keyword-only rest are for tests and benchmarks
        (explicit nodes without a topology, SSH options, the node run folder)."""
        api_key_env: str | None = None
        self._explicit_options = options is not None
        self.options = options or options_from_env(accept_new_host_keys or None)
        self.run_root = run_root or os.environ.get("EPDCTL_SSH_RUN_ROOT") or DEFAULT_RUN_ROOT
        self.parallel = parallel
        self.pool = ConnectionPool(self.options)
        self.sessions: dict[str, AgentSession] = {}
        self.cluster_dir = Path(cluster_dir) if cluster_dir else None
        self.cluster: str | None = cluster or getattr(topology, "name", None)
        self.api_key_env = api_key_env
        if topology is not None and getattr(topology, "router", None) is not None:
            self.api_key_env = self.api_key_env or topology.router.api_key_env
        self.nodes: dict[str, NodeAccess] = dict(nodes) if nodes else (
            nodes_from_topology(topology) if topology is not None else {})
        self.starter = NodeStarter(self, settle, parallel)
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
            self._recorded_ssh(doc)
            if "run_root" in doc:  # read back as written: nothing to save
                self.run_root = doc["run_root"]
                return
        save_nodes(cdir, {"cluster": self.cluster, "run_root": self.run_root,
                          "api_key_env": self.api_key_env,
                          "known_hosts": [str(Path(k).expanduser().absolute())
                                          for k in self.options.known_hosts],
                          "ssh_config": self.options.ssh_config,
                          "nodes": [n.to_dict() for n in self.nodes.values()]})

    def _recorded_ssh(self, doc: dict[str, Any]) -> None:
        """`status`/`logs`/`down` from another shell verify host keys against the files `up`
        used (recorded in ssh-nodes.json), unless this shell names its own (EPDCTL_KNOWN_HOSTS)."""
        if self._explicit_options or not doc.get("known_hosts"):
            return
        keep = self.options.known_hosts if os.environ.get("EPDCTL_KNOWN_HOSTS") else ()
        files = tuple(dict.fromkeys([*keep, *doc["known_hosts"]]))
        self.options = dataclasses.replace(self.options, known_hosts=files,
                                           ssh_config=doc.get("ssh_config", self.options.ssh_config))
        self.close()
        self.pool = ConnectionPool(self.options)

    @property
    def settle(self) -> float:
        """Seconds a started worker must stay alive to count as started."""
        return self.starter.settle

    @settle.setter
    def settle(self, value: float) -> None:
        self.starter.settle = value

    def bind_to_log(self, local_log: Path | None) -> None:
        """Find the cluster from a record's local log (``clusters/<name>/logs/``) when not yet bound."""
        if self.nodes and self.cluster:
            return
        if local_log is not None and local_log.parent.name == "logs":
            self._bind(local_log.parent.parent)
            return
        raise LaunchError("the ssh launcher needs the topology or the cluster's run folder")

    def access(self, node: str) -> NodeAccess:
        try:
            return self.nodes[node]
        except KeyError:
            raise LaunchError(f"[{node}] is not a node of cluster {self.cluster!r} "
                              f"(known: {', '.join(self.nodes) or 'none'})") from None

    def remote_dir(self, node: str) -> str:
        return f"{self.run_root.rstrip('/')}/{self.cluster}/{node}"

    def remote_log(self, rec: ProcessRecord) -> str:
        return f"{self.remote_dir(rec.node)}/{rec.name}.log"

    # ---- one node --------------------------------------------------------------------

    def agent(self, node: str, req: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
        """One agent call on ``node`` (the node's agent, started on first use)."""
        acc = self.access(node)
        session = self.sessions.setdefault(node, AgentSession(self.pool, acc))
        return session.call(req, timeout)

    def prepare_node(self, node: str) -> dict[str, Any]:
        """Connect, run setup lines, check the node's epdctl version, create the run folder."""
        return self.starter.prepare_node(node)

    def prepare(self, nodes: Iterable[str] | None = None) -> Results[dict[str, Any]]:
        """``prepare_node`` on every node at once; a per-node Results map."""
        return self.starter.prepare(nodes)

    def start_on_node(self, node: str, recs: list[ProcessRecord]) -> dict[str, Handle | Exception]:
        return self.starter.start_on_node(node, recs)

    # ---- Launcher contract -----------------------------------------------------------

    def start(self, recs: Sequence[ProcessRecord]) -> Results[Handle]:
        """Start many workers, one SSH command per node, nodes in parallel; per worker. Every
        node is prepared (version check) first; when one cannot be, nothing starts anywhere
        and LaunchError lists every bad node and the fine ones."""
        return self.starter.start(recs)

    def poll(self, recs: Sequence[ProcessRecord], lines: int = 20) -> Results[Status]:
        """Alive (same pid and start time) per worker, with the log tail of dead ones."""
        recs = list(recs)
        res: Results[Status] = Results()
        if not recs:
            return res
        self.bind_to_log(Path(recs[0].log))
        by_node = group_by_node([r for r in recs if r.handle is not None])
        per_node = fanout(by_node, lambda n, rs: self.agent(n, {
            "op": "poll", "lines": lines, "peek": PEEK_LINES,
            "workers": [self._rec(r) for r in rs]})["workers"], parallel=self.parallel)
        for r in recs:
            if r.handle is None:
                res.ok[r.name] = Status(False)
            elif r.node in per_node.failed:
                res.failed[r.name] = per_node.failed[r.node]
            else:
                st = per_node.ok[r.node][r.name]
                if not st["alive"]:
                    self.write_mirror(r, st.get("tail", ""))
                res.ok[r.name] = Status(st["alive"], None, st.get("tail", ""),
                                        int(st.get("restarts") or 0), st.get("last_exit"),
                                        st.get("peek", ""))
        return res

    def stop(self, recs: Sequence[ProcessRecord], grace: float = 10.0) -> Results[None]:
        """TERM exactly the recorded process groups on every node, KILL after ``grace``, then
        remove their containers there (by name; also those of records that are only a container,
        found by label).

        The last lines of every log are copied into the local mirror on the way out.
        """
        boxed = [r for r in recs if containers.removal(r) is not None]
        recs = [r for r in recs if r.handle is not None]
        res: Results[None] = Results()
        if not recs and not boxed:
            return res
        self.bind_to_log(Path((recs or boxed)[0].log))
        by_node = group_by_node(recs)
        per_node = fanout(by_node, lambda n, rs: self.agent(n, {
            "op": "stop", "grace": grace, "workers": [self._rec(r) for r in rs],
            "lines": MIRROR_LINES}, timeout=grace + 60)["workers"], parallel=self.parallel)
        for r in recs:
            if r.node in per_node.failed:
                res.failed[r.name] = per_node.failed[r.node]
                continue
            got = per_node.ok[r.node][r.name]
            self.write_mirror(r, got.get("tail", ""))
            if "error" in got:
                res.failed[r.name] = LaunchError(f"[{r.node}/{r.name}] {got['error']}")
            else:
                res.ok[r.name] = None
        self._remove_containers([r for r in boxed if r.name not in res.failed], res)
        return res

    def _remove_containers(self, recs: list[ProcessRecord], res: Results[None]) -> None:
        """Remove the records' containers, one agent call per node."""
        by_node = group_by_node(recs)
        per_node = fanout(by_node, lambda n, rs: self.agent(n, {
            "op": "run", "commands": [list(containers.removal(r) or ()) for r in rs],
            "timeout": containers.TIMEOUT_S}, timeout=containers.TIMEOUT_S * len(rs) + 30)["results"],
            parallel=self.parallel)
        for node, group in by_node.items():
            for i, r in enumerate(group):
                if node in per_node.failed:
                    res.failed[r.name] = per_node.failed[node]
                    continue
                got = per_node.ok[node][i]
                why = containers.removal_failure(r, containers.removal(r) or (), got["rc"], got["err"])
                if why is not None:
                    res.failed[r.name] = why
                    res.ok.pop(r.name, None)
                elif r.handle is None:
                    res.ok[r.name] = None

    def logs(self, rec: ProcessRecord, lines: int = 40) -> str:
        """The last ``lines`` of the worker's log on its node (also refreshes the mirror)."""
        self.bind_to_log(Path(rec.log))
        ans = self.agent(rec.node, {"op": "tail", "log": self.remote_log(rec), "lines": lines})
        self.write_mirror(rec, ans["text"])
        return str(ans["text"])

    def follow(self, rec: ProcessRecord, lines: int = 0,
               idle_timeout: float | None = None) -> Iterator[str]:
        """New lines of the remote log as they come (``tail -F``), until the caller stops
        (or ``idle_timeout`` seconds pass without a line: socket.timeout)."""
        self.bind_to_log(Path(rec.log))
        acc = self.access(rec.node)
        path = self.remote_log(rec)
        if path.startswith("~/"):
            path = "$HOME/" + shlex.quote(path[2:])
        else:
            path = shlex.quote(path)
        out = self.pool.get(acc.target).stream(f"exec tail -n {int(lines)} -F {path}",
                                               idle_timeout)
        for raw in out:
            yield raw.rstrip("\n") if isinstance(raw, str) else raw.decode().rstrip("\n")

    def place(self, text: str) -> str:
        return text

    def node_jobs(self, nodes: Sequence[str]) -> dict[str, Any]:
        """Programs run to completion on ``nodes`` (staging weights), over these connections."""
        from epdctl.launchers.ssh.streams import SSHJobs

        return {n: SSHJobs(n, self.pool, self.access(n)) for n in nodes}

    def node_runners(self, nodes: Sequence[str]) -> dict[str, Any]:
        """Over this launcher's connections (its host-key policy included)."""
        return ssh_runners(self.pool, {n: self.access(n) for n in nodes})

    def release(self) -> None:
        return None

    def holding(self, recs: Sequence[ProcessRecord]) -> None:
        return None

    def records(self, node: str) -> list[dict[str, Any]]:
        """What the node's run folder says epdctl started there (and has not stopped)."""
        return self.agent(node, {"op": "records", "dir": self.remote_dir(node)})["records"]

    def close(self) -> None:
        for s in self.sessions.values():
            s.close()
        self.sessions = {}
        self.pool.close()

    def orphans(self) -> list[ProcessRecord]:
        """Every node's process groups carrying this cluster's marker, and its containers
        labelled with the cluster and that node (nodes in parallel); LaunchError naming the
        nodes that could not be searched (after the others)."""
        cluster = cluster_id(self.cluster_dir)
        if not cluster:
            return []
        per_node = fanout({n: n for n in self.nodes}, self._search, parallel=self.parallel)
        out = [rec for found in per_node.ok.values() for rec in found]
        try:
            raise_if_failed(per_node, "searching the nodes for the cluster's processes")
        except LaunchError as e:
            e.found = out  # type: ignore[attr-defined]  # what the reachable nodes had
            raise
        return out

    def _search(self, node: str, _: object) -> list[ProcessRecord]:
        """One node's marked process groups and labelled containers."""
        out = []
        for f in self.agent(node, {"op": "find", "cluster": cluster_id(self.cluster_dir)})["found"]:
            log = (self.cluster_dir / "logs" / f"{f['name']}.log") if self.cluster_dir else ""
            out.append(ProcessRecord(name=f["name"], role="unknown", node=node, log=str(log),
                                     handle=Handle(pid=f["pid"], pgid=f["pgid"],
                                                   create_time=f["create_time"],
                                                   token=f["token"])))
        searches = containers.searches(str(self.cluster), node)
        got = self.agent(node, {"op": "run", "commands": [list(a) for _, a in searches],
                                "timeout": containers.TIMEOUT_S})["results"]
        for (runtime, _), ans in zip(searches, got):
            if ans["rc"] == 0:  # else not installed, or no daemon: nothing of it to find
                out += containers.found(runtime, ans["out"], node)
        return out

    # ---- helpers ---------------------------------------------------------------------

    def _rec(self, r: ProcessRecord) -> dict[str, Any]:
        assert r.handle is not None
        return {"name": r.name, "pid": r.handle.pid, "pgid": r.handle.pgid,
                "create_time": r.handle.create_time, "token": r.handle.token,
                "log": self.remote_log(r)}

    def write_mirror(self, rec: ProcessRecord, text: str) -> None:
        if not rec.log or self.cluster_dir is None:
            return
        path = Path(rec.log)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"=== epdctl: last lines of the remote log, fetched "
                        f"{time.strftime('%Y-%m-%d %H:%M:%S')} ===\n{text}\n")

    def __enter__(self) -> "SSHLauncher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
