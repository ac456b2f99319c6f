"""Bring processes up all at once and wait for them in one loop; take a cluster down.

Why all at once: nothing in the plan needs an order. Prefills know their encoders' URLs from the
plan and the encoder registry takes late arrivals; the router takes workers as they become
healthy. So `up` takes as long as its slowest worker, not the sum of the roles. One loop polls
every process (one batched launcher call: one SSH command per node, one ``squeue``) and probes
every pending `/health` in parallel, with progress per role and, per waiting worker, the last
meaningful line of its log and how long it has waited; the first worker that dies stops all
the others at once (it never waits out a timeout), and its log says why. Each process has its
own start-up budget (``timeouts``: epdctl/orchestrate/startup.py scales it with the weights); a
node that stops answering is named, and fails the start after ``NODE_SILENT_S``. `rebalance` starts a moved worker through the same
``BringUp.start`` + ``BringUp.wait``. Every start is recorded on disk at once, so a crash or
Ctrl-C of epdctl itself still leaves `down` something to stop.
"""

from __future__ import annotations

import http.client
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from epdctl.errors import LaunchError, ProbeError
from epdctl.launchers import containers
from epdctl.launchers.base import Launcher, Results, Status, tail
from epdctl.orchestrate.startup import meaningful_line
from epdctl.http.probes import probe_health
from epdctl.http.routerctl import RouterClient
from epdctl.render.plan import ROUTER_TYPES, Plan, placed_plan
from epdctl.state.store import ClusterDir, ClusterState, ProcessRecord
from epdctl.topology.model import ROLE_ORDER, Role

log = logging.getLogger(__name__)
NODE_SILENT_S = 20.0   # a node that answers no poll for this long fails the start, named
SHOW_EVERY_S = 15.0    # a waiting worker's line is shown again after this long, even unchanged


@dataclass(frozen=True)
class Event:
    """Progress of `up`, for the command to display."""

    stage: str            # role name, "router", or "all" (kind "progress")
    kind: str             # starting | waiting | ready | registered | progress | worker | node
    ready: int = 0
    total: int = 0
    elapsed: float = 0.0
    detail: str = ""


OnEvent = Callable[[Event], None]


def records_of(plan: Plan, engine: str, cdir: ClusterDir) -> list[ProcessRecord]:
    """One record per planned process (workers, then the router), logs in the run folder."""
    recs = [ProcessRecord.of(w, engine, cdir.log(w.name)) for w in plan.workers]
    if plan.router is not None:
        recs.append(ProcessRecord.of(plan.router, engine, cdir.log("router")))
    for rec in recs:
        rec.restart = dict(getattr(plan, "restart", {}).get(rec.role, {}))
    return recs


def _all_healthy_on(client: RouterClient, urls: set[str]) -> bool:
    """Every one of ``urls`` listed healthy by the router. smg takes a ``POST /workers`` as a
    job (202) and its ``/readiness`` wants only one healthy prefill and decode, so a router
    that reads ready may not route to the last registered worker yet."""
    if not urls:
        return True
    try:
        listed = {w.url for w in client.workers() if w.healthy}
    except ProbeError:
        return False
    return urls <= listed


def _enough_healthy_on(client: RouterClient, n: int) -> bool:
    """At least ``n`` prefill/decode/regular workers listed healthy: the same wait for a router
    whose command names its workers (smg activates each through its own job, after its
    ``/readiness`` already reads ready). A router without ``GET /workers`` cannot tell: ready."""
    if n == 0:
        return True
    try:
        listed = client.workers()
    except ProbeError:
        return True
    return sum(w.healthy and w.worker_type in ROUTER_TYPES.values() for w in listed) >= n


def _healthy(rec: ProcessRecord) -> bool:
    """One probe. A probe to a port nothing listens on yet can connect to itself (TCP
    self-connect in the ephemeral range) and read its own request back: "not ready yet"."""
    try:
        return probe_health(rec.url, rec.health_path).ok and (
            rec.ready_path is None or probe_health(rec.url, rec.ready_path).ok)
    except http.client.HTTPException:
        return False


class BringUp:
    """Starts records through a launcher, records them, waits; stops them all on failure."""

    def __init__(self, launcher: Launcher, cdir: ClusterDir, state: ClusterState, *,
                 timeout: float = 300.0, on_event: OnEvent | None = None,
                 timeouts: Mapping[str, float] | None = None):
        self.launcher = launcher
        self.cdir = cdir
        self.state = state
        self.timeout = timeout                   # a process not named in ``timeouts``
        self.timeouts = dict(timeouts or {})     # process or worker name -> seconds
        self.on_event = on_event or (lambda e: None)
        self.started: list[ProcessRecord] = []
        self.started_at: dict[str, float] = {}   # monotonic time each start returned
        self.ready_at: dict[str, float] = {}     # ... and each was first seen healthy
        self.plan: Plan | None = None            # what `run` started, placed
        self.doing: dict[str, str] = {}          # last meaningful log line per waiting process
        self._shown: dict[str, tuple[str, float]] = {}
        self._silent: dict[str, tuple[float, str]] = {}  # node -> (since, why)

    # ---- `up` ----------------------------------------------------------------------------

    def run(self, plan: Plan) -> ClusterState:
        """Start every process of ``plan`` at once, wait for all; on any failure (Ctrl-C
        included) stop what was started. ``self.plan``: the plan at the addresses the launcher
        chose (SLURM: the allocated nodes'), as the processes were started."""
        try:
            self.plan = placed_plan(plan, self.launcher.place)
            recs = records_of(self.plan, self.state.engine, self.cdir)
            for role in (*ROLE_ORDER, Role.ROUTER):
                n = sum(r.role == role for r in recs)
                if n:
                    self.on_event(Event(role.value, "starting", 0, n))
            self.start(recs)
            self.wait(recs)
        except LaunchError as e:
            res = self.abort()
            note = (f"stopped the {len(self.started)} process(es) this run had started"
                    if res.all_ok else f"could not stop everything: {res.failed}; "
                    f"run `epdctl down {self.state.name}`")
            raise LaunchError(f"{e}\n{note}") from e
        except BaseException:
            self.abort()
            raise
        self.state.phase = "running"
        self.cdir.save(self.state)
        return self.state

    def abort(self) -> Results[None]:
        """Stop everything this run started, give back the allocation, forget the state."""
        res = self.launcher.stop(self.started, grace=15.0)
        if res.all_ok:
            self.launcher.release()
            self.cdir.clear()
        return res

    # ---- shared with `rebalance` ---------------------------------------------------------

    def start(self, recs: Sequence[ProcessRecord]) -> None:
        """One batched start; every started process is on disk before anything else happens.
        LaunchError naming every worker that did not start."""
        res = self.launcher.start(recs)
        now, mono = time.time(), time.monotonic()
        for rec in recs:
            if rec.name in res.ok:
                rec.handle, rec.since = res.ok[rec.name], now
                self.started_at[rec.name] = mono
                self.started.append(rec)
                self.state.processes.append(rec)
        boxed = [r for r in recs if r.name in res.ok and containers.digest_command(r) is not None]
        if boxed:  # the id of the image each node's containers run (`status`)
            containers.record_digests(boxed, self.launcher.node_runners(sorted({r.node for r in boxed})))
        self.cdir.save(self.state)
        res.raise_if_failed("starting")

    def wait(self, recs: Sequence[ProcessRecord], register: bool | None = None) -> None:
        """Until every record is healthy (non-leader ranks: alive); the router, when among
        them, gets each prefill/decode leader as it becomes healthy (``register``: default
        when the plan says it takes its workers through its API)."""
        router = next((r for r in recs if r.role == "router"), None)
        if register is None:
            register = router is not None and router.registers_workers
        client = RouterClient(router.url, self.state.api_key_env) if router else None
        t0 = time.monotonic()
        pending = {r.name: r for r in recs}
        to_register = [r for r in recs if register and r.router_type is not None]
        routed = {r.url.rstrip("/") for r in to_register}
        static = 0 if register or router is None else sum(r.router_type is not None for r in recs)
        router_alive = False
        shown: dict[str, int] = {}
        totals = {role.value: sum(r.role == role for r in recs) for role in (*ROLE_ORDER, Role.ROUTER)}
        with ThreadPoolExecutor(max_workers=8) as pool:
            while pending:
                self._check_alive(list(pending.values()), t0)
                probe = [r for r in pending.values() if r.is_leader and r.role != "router"]
                for rec, ok in zip(probe, pool.map(_healthy, probe)):
                    if ok:
                        del pending[rec.name]
                        self.ready_at[rec.name] = time.monotonic()
                for rec in [r for r in pending.values() if not r.is_leader]:
                    del pending[rec.name]  # non-leader ranks serve no HTTP; alive is enough
                if router is not None and router.name in pending and client is not None:
                    router_alive = router_alive or client.alive()
                    if router_alive:
                        to_register = self._register(client, to_register, pending)
                        if (not to_register and client.readiness()[0]
                                and _all_healthy_on(client, routed) and _enough_healthy_on(client, static)):
                            del pending[router.name]
                            self.ready_at[router.name] = time.monotonic()
                elapsed = time.monotonic() - t0
                self._progress(recs, pending, totals, shown, elapsed)
                if not pending:
                    break
                late = [r for r in pending.values() if self._waited(r, t0) > self.budget(r)]
                if late:
                    raise self._timeout(late[0], t0)
                time.sleep(0.3)

    # ---- helpers -------------------------------------------------------------------------

    def _progress(self, recs: Sequence[ProcessRecord], pending: dict[str, ProcessRecord],
                  totals: dict[str, int], shown: dict[str, int], elapsed: float) -> None:
        """Per role: an event when its ready count changes; every round: one "progress"
        event with every role's count (the one updating line of a terminal)."""
        counts = {role: total - sum(r.role == role for r in pending.values())
                  for role, total in totals.items() if total}
        self.on_event(Event("all", "progress", len(recs) - len(pending), len(recs), elapsed,
                            "  ".join(f"{role} {n}/{totals[role]}" for role, n in counts.items())))
        for role, total in totals.items():
            if not total:
                continue
            ready = total - sum(r.role == role for r in pending.values())
            if shown.get(role) == ready:
                continue
            shown[role] = ready
            kind = "ready" if ready == total else "waiting"
            self.on_event(Event(role, kind, ready, total, elapsed))

    def budget(self, rec: ProcessRecord) -> float:
        """Seconds ``rec`` may take to become ready."""
        return self.timeouts.get(rec.name, self.timeouts.get(rec.worker, self.timeout))

    def _waited(self, rec: ProcessRecord, t0: float) -> float:
        return time.monotonic() - self.started_at.get(rec.name, t0)

    def _check_alive(self, recs: list[ProcessRecord], t0: float | None = None) -> None:
        """Every record alive, or a LaunchError with the dead one's log tail; a node that has
        not answered for ``NODE_SILENT_S`` is named and fails the start. ``t0``: the wait's
        start, to report what each waiting process is doing."""
        polled = self.launcher.poll(recs)
        self._judge_silence(recs, polled)
        for rec in recs:
            st = polled.ok.get(rec.name)
            if st is None:
                continue
            if not st.alive:
                how = (f"exited with status {st.exit_code}" if st.exit_code is not None
                       else st.last_exit or "died")  # the node's supervisor says how (ssh)
                text = st.tail or tail(Path(rec.log), 20)
                raise LaunchError(f"[{rec.node}/{rec.name}] {how} during startup; last lines "
                                  f"of {rec.log}:\n{text}")
            if t0 is not None:
                self._report_doing(rec, st, t0)

    def _judge_silence(self, recs: list[ProcessRecord], polled: Results[Status]) -> None:
        now = time.monotonic()
        failed_nodes: dict[str, str] = {}
        for rec in recs:
            if rec.name in polled.failed:
                failed_nodes.setdefault(rec.node, str(polled.failed[rec.name]).splitlines()[0])
        for node in [n for n in self._silent if n not in failed_nodes]:
            del self._silent[node]
        for node, why in failed_nodes.items():
            since, _ = self._silent.setdefault(node, (now, why))
            waiting = sorted(r.name for r in recs if r.node == node)
            if now - since == 0:
                self.on_event(Event(node, "node", elapsed=0.0,
                                    detail=f"not answering ({why}); waiting for it"))
            if now - since >= NODE_SILENT_S:
                raise LaunchError(
                    f"node {node} stopped answering {now - since:.0f}s ago while "
                    f"{', '.join(waiting)} {'was' if len(waiting) == 1 else 'were'} starting on it: "
                    f"{why}; check the machine (`epdctl check TOPOLOGY`), then `epdctl up` again")

    def _report_doing(self, rec: ProcessRecord, st: Status, t0: float) -> None:
        """The process's last meaningful log line, as an event when it changed (or, unchanged,
        every ``SHOW_EVERY_S``). Read from the poll (a node's agent) or the log here."""
        text = st.peek if st.peek is not None else (tail(Path(rec.log), 12) if rec.log else "")
        line = meaningful_line(text)
        if not line:
            return
        self.doing[rec.name] = line
        waited = self._waited(rec, t0)
        last = self._shown.get(rec.name)
        if last is not None and last[0] == line and waited - last[1] < SHOW_EVERY_S:
            return
        self._shown[rec.name] = (line, waited)
        self.on_event(Event(rec.name, "worker", elapsed=waited,
                            detail=f"[{rec.node}/{rec.name}] {line}"))

    def _register(self, client: RouterClient, todo: list[ProcessRecord],
                  pending: dict[str, ProcessRecord]) -> list[ProcessRecord]:
        """Register the leaders that are healthy now; returns those still to register."""
        left = []
        for rec in todo:
            if rec.name in pending:
                left.append(rec)
                continue
            rec.router_id = client.add_worker(rec.url, str(rec.router_type),
                                              bootstrap_port=rec.bootstrap_port,
                                              model=self.state.model)
            self.on_event(Event("router", "registered", detail=f"{rec.name} -> {rec.router_id}"))
            self.cdir.save(self.state)
        return left

    def _timeout(self, rec: ProcessRecord, t0: float) -> LaunchError:
        what = "ready" if rec.role == "router" else "healthy"
        doing = self.doing.get(rec.name)
        note = f" (last doing: {doing})" if doing else ""
        return LaunchError(
            f"[{rec.node}/{rec.name}] not {what} after {self._waited(rec, t0):.0f}s, its start-up "
            f"budget of {self.budget(rec):.0f}s{note}; if it is still loading, raise "
            f"`startup: {{timeout: S}}` for its role in the topology (or --timeout). Last lines of "
            f"{rec.log}:\n{tail(Path(rec.log), 15)}")


def tear_down(state: ClusterState | None, launcher: Launcher, grace: float = 15.0, release: bool = True
              ) -> tuple[Results[None], list[ProcessRecord]]:
    """Stop every recorded process (all at once: smg alone takes 5-8 s to exit), then every
    process still carrying the cluster's marker (a state emptied, edited, damaged or deleted
    leaves some unrecorded); then, with ``release``, give back what `up` acquired (a SLURM
    allocation) when everything stopped (`down` releases it itself, after removing the transfer
    store through that allocation). Returns the results and the unrecorded processes found.

    A recorded process whose stop failed (its node did not answer) is no stray: it is left to
    its own node and its record to a later `down`, also where nodes share a machine and
    another node's search sees it."""
    recs = list(state.processes) if state is not None else []
    res = launcher.stop(recs, grace=grace) if recs else Results[None]()
    unfinished = {r.handle.token for r in recs if r.name in res.failed and r.handle is not None
                  and r.handle.token}
    try:
        strays = launcher.orphans()
        sweep_error: LaunchError | None = None
    except LaunchError as e:
        strays, sweep_error = list(getattr(e, "found", [])), e
    strays = [s for s in strays if s.handle is None or s.handle.token not in unfinished]
    if strays:
        more = launcher.stop(strays, grace=grace)
        res.failed.update({f"{r.node}/{r.name} (unrecorded)": more.failed[r.name]
                           for r in strays if r.name in more.failed})
    if sweep_error is not None:
        res.failed["(search)"] = sweep_error
    if res.all_ok and release:
        launcher.release()
    return res, strays
