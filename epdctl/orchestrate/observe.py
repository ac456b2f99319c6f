"""Reconcile a recorded cluster with reality: process alive, HTTP health, load, router view.

Why reconcile rather than trust state.json: workers die behind epdctl's back. `status` shows
what is true now (a dead worker is dead, with the last lines of its log), and the router's own
view (`GET /workers`) tells whether traffic still goes to a worker. Each worker's `/metrics`
(and the router's Prometheus page) gives the key figures of `epdctl bench`, cumulative since
start; a page that does not answer leaves the figures at None, it never fails `status`.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from epdctl.http.metrics import page
from epdctl.bench.target import cluster_endpoints
from epdctl.errors import LaunchError, ProbeError
from epdctl.launchers.base import Launcher, Status
from epdctl.http.metrics_summary import role_figures, router_figures, worker_figures
from epdctl.http.probes import Load, get_loads, http, probe_health
from epdctl.http.routerctl import RouterClient, RouterWorker
from epdctl.topology.model import ROLE_ORDER, Role
from epdctl.state.store import ClusterState, ProcessRecord


@dataclass
class WorkerView:
    """One row of `epdctl status`."""

    name: str
    role: str
    node: str
    pid: int
    url: str
    alive: bool | None            # None: its node could not be asked (unreachable)
    uptime_s: float | None
    health: str                   # ok | dead | unreachable: ... | connection refused | HTTP 503
    healthy: bool
    load: Load | None = None
    router: str = "-"             # the router's status for this worker; "-" when not routed
    log: str = ""
    log_tail: str = ""            # last lines of the log when the worker is dead
    restarts: int = 0             # times its supervisor restarted it
    last_exit: str | None = None  # why its last run ended
    figures: dict[str, Any] | None = None  # metrics_summary.worker_figures; None: no /metrics
    metrics: dict[str, float] | None = field(default=None, repr=False)  # raw scrape (not shown)
    image: str = ""  # the container image it runs in ("" for a bare process)
    image_digest: str = ""  # that image's id on its node when `up` started it ("" unknown or bare)


@dataclass
class ClusterView:
    """The whole `epdctl status` answer."""

    name: str
    topology: str
    phase: str
    launcher: str
    workers: list[WorkerView] = field(default_factory=list)
    router_ready: bool | None = None
    router_detail: str = ""
    router_figures: dict[str, Any] | None = None  # None when its Prometheus page does not answer
    problem: str = ""             # what is wrong with the cluster as a whole (a killed `up`)
    unreachable: dict[str, str] = field(default_factory=dict)  # node -> why it was not asked
    allocation: dict[str, Any] | None = None  # a SLURM job: job, state, detail (why it ended), owned

    def role_figures(self) -> dict[str, dict[str, Any]]:
        """role -> figures over the workers whose /metrics answered, in start order."""
        out: dict[str, dict[str, Any]] = {}
        for role in ROLE_ORDER:
            scraped = [w.metrics for w in self.workers if w.role == role and w.metrics]
            if scraped:
                out[role.value] = role_figures(role.value, scraped)
        return out

    def summary(self) -> dict[str, tuple[int, int]]:
        """role -> (healthy, total), in start order."""
        out: dict[str, tuple[int, int]] = {}
        for role in (*ROLE_ORDER, Role.ROUTER):
            rows = [w for w in self.workers if w.role == role]
            if rows:
                out[role.value] = (sum(w.healthy for w in rows), len(rows))
        return out

    @property
    def healthy(self) -> bool:
        return (all(w.healthy for w in self.workers) and self.router_ready is not False
                and self.phase not in ("failed", "starting", "stopping"))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for w in d["workers"]:
            w.pop("metrics", None)
        d["figures"] = {"cumulative_since_start": True, "roles": self.role_figures(),
                        "router": self.router_figures}
        d["summary"] = {r: {"ready": a, "total": b} for r, (a, b) in self.summary().items()}
        d["healthy"] = self.healthy
        return d


def _router_view(state: ClusterState) -> tuple[dict[str, RouterWorker], bool | None, str]:
    rec = state.router
    if rec is None:
        return {}, None, ""
    client = RouterClient(rec.url, state.api_key_env, timeout=3.0)
    ready, doc = client.readiness()
    if "healthy_workers" in doc:
        detail = f"{doc['healthy_workers']}/{doc.get('total_workers', '?')} workers healthy"
    else:
        detail = str(doc.get("reason") or doc.get("status") or "")
    try:
        by_url = {w.url: w for w in client.workers()}
    except ProbeError as e:
        return {}, ready, f"{detail}; /workers: {e}"
    return by_url, ready, detail


def _router_figures(state: ClusterState) -> dict[str, Any] | None:
    url = next((e.url for e in cluster_endpoints(state) if e.role == "router"), None)
    samples = page(url, api_key_env=state.api_key_env) if url else None
    return router_figures(samples) if samples is not None else None


def _worker_view(rec: ProcessRecord, st: Status | Exception, routed: dict[str, RouterWorker],
                 tail_lines: int, key_env: str | None) -> WorkerView:
    alive = isinstance(st, Status) and st.alive
    view = WorkerView(name=rec.name, role=rec.role, node=rec.node, pid=rec.pid, url=rec.url,
                      alive=alive, uptime_s=time.time() - rec.since if alive else None,
                      health="dead", healthy=False, log=rec.log, image=str(rec.container.get("image", "")),
                      image_digest=str(rec.container.get("digest", "")))
    if isinstance(st, Status):
        view.restarts, view.last_exit = st.restarts, st.last_exit
    if isinstance(st, Exception):  # the node was not asked: neither alive nor dead
        view.alive, view.health = None, f"unreachable: {unreachable_reason(rec.node, st)}"
    elif not alive:
        view.log_tail = "\n".join(st.tail.splitlines()[-tail_lines:]) if tail_lines > 0 else ""
    elif rec.is_leader:
        h = probe_health(rec.url, rec.health_path)
        view.health, view.healthy = h.detail, h.ok
        if h.ok and rec.role != "router":
            view.load = get_loads(rec.url)
            view.metrics = page(rec.url.rstrip("/") + "/metrics", api_key_env=key_env)
            if view.metrics is not None:
                view.figures = worker_figures(rec.role, view.metrics)
                f = view.figures
                if view.load is None and f.get("running") is not None:  # vLLM: no /v1/loads, its gauges
                    view.load = Load(int(f["running"]), int(f.get("waiting") or 0), f.get("kv_cache_usage"))
    else:
        view.health, view.healthy = "alive (non-leader rank)", True
    rw = routed.get(rec.url.rstrip("/"))
    if rw is not None:
        view.router = rw.status or ("healthy" if rw.healthy else "unhealthy")
    elif routed and rec.role in ("prefill", "decode", "colocated") and rec.is_leader:
        view.router = "absent"
    return view


def unreachable_reason(node: str, err: Exception) -> str:
    """The first line of a node's failure, without its ``[node]`` prefix."""
    text = (str(err) or type(err).__name__).splitlines()[0]
    return text.removeprefix(f"[{node}] ")


def observe(state: ClusterState, launcher: Launcher, tail_lines: int = 10) -> ClusterView:
    """Probe every recorded process (in parallel) and the router; never raises for a dead one."""
    view = ClusterView(name=state.name, topology=state.topology, phase=state.phase,
                       launcher=state.launcher)
    routed, view.router_ready, view.router_detail = _router_view(state)
    view.router_figures = _router_figures(state)
    polled = launcher.poll(state.processes)
    try:
        held = launcher.holding(state.processes)
    except LaunchError as e:  # the scheduler did not answer: say so, show the rest
        held = None
        view.problem = f"could not ask for the allocation's state: {e}"
    if held is not None:
        view.allocation = asdict(held)
        if held.state != "RUNNING":  # a cancelled or timed-out job never reads "running"
            view.phase, view.problem = "failed", held.detail
    for rec in state.processes:  # one line per node that could not be asked
        if rec.name in polled.failed and rec.node not in view.unreachable:
            view.unreachable[rec.node] = unreachable_reason(rec.node, polled.failed[rec.name])
    with ThreadPoolExecutor(max_workers=8) as pool:
        rows = pool.map(lambda r: _worker_view(
            r, polled.ok.get(r.name) or polled.failed[r.name], routed, tail_lines,
            state.api_key_env),
            state.processes)
        view.workers = list(rows)
    router_row = next((w for w in view.workers if w.role == "router"), None)
    if router_row is not None and router_row.alive:
        router_row.router = "ready" if view.router_ready else f"not ready ({view.router_detail})"
        router_row.healthy = router_row.healthy and bool(view.router_ready)
    return view
