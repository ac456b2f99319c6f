"""Run a planned rebalance on a live cluster, one worker at a time, with rollback.

Per move: drain (out of the router / encoder registries, in-flight to zero) -> stop -> start in
the new role through the cluster's launcher -> wait for `/health` -> register (router
``POST /workers`` or every prefill's encoder registry) -> verify a real transfer through the
moved worker (canary answers well formed and its transport byte counters move) -> record.
If the new role does not come up (or moves no data), the worker is restarted in its old role,
re-registered and the move is recorded as ``rolled_back``. The state file is saved after every
start/stop so `status` and `down` always see the processes that really run.
"""

from __future__ import annotations

import http.client
import logging
import os
import shlex
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlsplit

from epdctl.errors import EpdctlError, LaunchError
from epdctl.launchers.base import Handle, LaunchSpec, Launcher, tail
from epdctl.launchers.lifecycle import to_handle
from epdctl.probes import probe_health
from epdctl.rebalance import drain as dr
from epdctl.rebalance import history, links
from epdctl.rebalance.plan import Move, RebalancePlan, apply_move
from epdctl.rebalance.steps import MoveResult, Step, Timer, summary
from epdctl.render import build_plan
from epdctl.render.plan import Plan, WorkerSpec
from epdctl.routerctl import RouterClient
from epdctl.state import ClusterDir, ClusterState, ProcessRecord
from epdctl.topology.model import Topology

log = logging.getLogger(__name__)

# Test-only fault injection: extra argv tokens appended to a worker started in its NEW role, so
# the e2e test can make that start fail and exercise the rollback. Never set it in production.
INJECT_ENV = "EPDCTL_REBALANCE_TEST_INJECT_ARGS"
ROUTER_TYPES = {"prefill": "prefill", "decode": "decode"}


@dataclass
class Options:
    engine: str = "embedded"
    model: str | None = None
    api_key_env: str | None = None
    ready_timeout: float = 300.0
    drain_timeout: float = 120.0
    verify: bool = True
    verify_attempts: int = 8
    grace: float = 15.0


class Executor:
    """Applies the moves of one RebalancePlan to the running cluster."""

    def __init__(self, rp: RebalancePlan, cdir: ClusterDir, state: ClusterState,
                 launcher: Launcher, opts: Options, on_step: Callable[[Step], None] | None = None):
        self.rp = rp
        self.cdir = cdir
        self.state = state
        self.launcher = launcher
        self.opts = opts
        self.on_step = on_step or (lambda s: None)
        router = state.router
        self.client = (RouterClient(router.url, state.api_key_env) if router is not None
                       else None)

    # -- the whole rebalance -------------------------------------------------------------------

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """Every move in order; stops at the first one that does not succeed. Returns the record."""
        record: dict[str, Any] = {
            "id": uuid.uuid4().hex[:12], "cluster": self.state.name, "who": history.who(),
            "started": time.time(), "request": request, "moves": []}
        if self.launcher.name == "local":
            _extra_ports_free(self.rp)
        results = [MoveResult(m) for m in self.rp.moves]
        cur = self.rp.before
        try:
            for res in results:
                try:
                    cur = self._move(cur, res)
                except BaseException as e:
                    res.outcome, res.error = "failed", res.error or summary(e)
                    raise
                if res.outcome != "done":
                    break
        finally:
            for res in results:
                if res.outcome == "pending":
                    res.outcome = "skipped"
            outcomes = {r.outcome for r in results}
            record["moves"] = [r.to_dict() for r in results]
            record["outcome"] = ("done" if outcomes == {"done"} else
                                 "failed" if "failed" in outcomes else
                                 "rolled_back" if "rolled_back" in outcomes else "partial")
            record["finished"] = time.time()
            history.append(self.cdir.root, record)
        return record

    # -- one move ------------------------------------------------------------------------------

    def _move(self, cur: Topology, res: MoveResult) -> Topology:
        m = res.move
        label = f"{m.worker} -> {m.new_name}"
        plan_old = build_plan(cur)
        after = apply_move(cur, m)
        plan_new = build_plan(after)
        old = _specs(plan_old, m.worker)
        new = _specs(plan_new, m.new_name)
        regs = _registries(plan_old, exclude=m.worker)
        timed = Timer(res, label, self.on_step)
        undo: dict[str, Any] = {}
        try:
            with timed("drain"):
                undo = dr.drain(m.old_role, old[0].url, engine=self.opts.engine,
                                client=self.client, registries=regs,
                                timeout=self.opts.drain_timeout, api_key_env=self.state.api_key_env)
        except EpdctlError as e:
            res.error = f"drain: {e}"
            self._undo_drain(m, old[0], regs, undo)
            res.outcome = "rolled_back"
            self.on_step(Step(label, "rollback", detail=res.error))
            return cur
        with timed("stop"):
            self._stop(m.worker)
        try:
            inject = shlex.split(os.environ.get(INJECT_ENV, ""))
            with timed("start"):
                handles = [self._start(s, inject) for s in new]
            with timed("ready"):
                self._wait_ready(new[0], handles[0])
            with timed("register"):
                self._register(m.new_role, new[0], _registries(plan_new, exclude=m.new_name))
            if self.opts.verify:
                with timed("verify"):
                    res.link = self._verify(new[0], m.new_role, plan_new)
        except EpdctlError as e:
            res.error = summary(e)
            self.on_step(Step(label, "rollback", detail=res.error))
            with timed("rollback"):
                try:
                    self._rollback(m, new, old, regs)
                    res.outcome = "rolled_back"
                except EpdctlError as e2:
                    res.outcome = "failed"
                    res.error += f"; rollback failed: {e2}"
                    raise LaunchError(f"{label}: {res.error}") from e2
            return cur
        res.outcome = "done"
        self.on_step(Step(label, "done", sum(res.steps.values())))
        return after

    def _undo_drain(self, m: Move, spec: WorkerSpec, regs: list[str], undo: dict[str, Any]
                    ) -> None:
        """The worker is still running in its old role: put it back into service."""
        if undo.get("paused"):
            dr.continue_generation(spec.url)
        self._register(m.old_role, spec, regs)

    def _rollback(self, m: Move, new: list[WorkerSpec], old: list[WorkerSpec],
                  regs: list[str]) -> None:
        """Undo a failed start: stop the new role, start the old one, re-register it."""
        self._deregister(m.new_role, new[0], regs)
        self._stop(m.new_name)
        handles = [self._start(s, []) for s in old]
        self._wait_ready(old[0], handles[0])
        self._register(m.old_role, old[0], regs)

    # -- process control -----------------------------------------------------------------------

    def _records(self, worker: str) -> list[ProcessRecord]:
        return [p for p in self.state.processes
                if p.name == worker or p.name.startswith(worker + ".r")]

    def _stop(self, worker: str) -> None:
        recs = self._records(worker)
        if recs:
            self.launcher.stop([to_handle(p) for p in recs], grace=self.opts.grace).raise_if_failed(
                f"stopping {worker}")
        self.state.processes = [p for p in self.state.processes if p not in recs]
        self.cdir.save(self.state)

    def _start(self, spec: WorkerSpec, inject: list[str]) -> Handle:
        launch = LaunchSpec(name=spec.name, role=spec.role, node=spec.node,
                            argv=(*spec.argv, *inject), env=dict(spec.env or {}))
        h = self.launcher.start(launch, self.cdir.log(spec.name))
        self.state.processes.append(ProcessRecord(
            name=h.name, role=h.role, node=h.node, host=spec.host, port=int(spec.port),
            url=spec.url, pid=h.pid, pgid=h.pgid, create_time=h.create_time, log=str(h.log),
            since=h.since, argv=list(h.argv), health_path=spec.health_path,
            bootstrap_port=spec.bootstrap_port, is_leader=spec.is_leader))
        self.cdir.save(self.state)
        return h

    def _wait_ready(self, spec: WorkerSpec, h: Handle) -> None:
        deadline = time.monotonic() + self.opts.ready_timeout
        while not _healthy(spec):
            if not self.launcher.is_alive(h):
                raise LaunchError(f"[{spec.node}/{spec.name}] exited during startup; last lines "
                                  f"of {h.log}:\n{tail(h.log, 10)}")
            if time.monotonic() > deadline:
                raise LaunchError(f"[{spec.node}/{spec.name}] not healthy after "
                                  f"{self.opts.ready_timeout:.0f}s; see {h.log}")
            time.sleep(0.3)

    # -- registration --------------------------------------------------------------------------

    def _register(self, role: str, spec: WorkerSpec, regs: list[str]) -> None:
        if role == "encoder":
            dr.register_encoder(regs, spec.url, api_key_env=self.state.api_key_env)
            return
        if self.client is None or role not in ROUTER_TYPES:
            return
        if self.client.find(spec.url) is None:
            wid = dr.router_add(self.client, spec.url, ROUTER_TYPES[role],
                                bootstrap_port=spec.bootstrap_port, model=self.opts.model,
                                timeout=self.opts.drain_timeout)
            rec = self.state.find(spec.name)
            if rec is not None:
                rec.router_id = wid
                self.cdir.save(self.state)

    def _deregister(self, role: str, spec: WorkerSpec, regs: list[str]) -> None:
        try:
            if role == "encoder":
                dr.unregister_encoder(regs, spec.url, self.state.api_key_env)
            elif self.client is not None:
                dr.router_remove(self.client, spec.url, timeout=self.opts.drain_timeout)
        except EpdctlError as e:
            log.warning("could not deregister %s before rollback: %s", spec.name, e)

    # -- link verification ---------------------------------------------------------------------

    def _verify(self, spec: WorkerSpec, role: str, plan: Plan) -> dict[str, Any]:
        router = self.state.router
        return links.verify(spec, role, plan, router_url=router.url if router else None,
                            model=self.opts.model, api_key_env=self.state.api_key_env,
                            attempts=self.opts.verify_attempts)


def _extra_ports_free(rp: RebalancePlan) -> None:
    """Before anything moves: the ports a move adds (a new prefill's bootstrap ports) are free.

    The HTTP port is not checked: the worker's old role still holds it until the stop."""
    busy = []
    for m in rp.moves:
        spec = _specs(rp.plan_after, m.new_name)[0] if any(
            w.name == m.new_name for w in rp.plan_after.workers) else None
        for port in (m.bootstrap_port, m.encoder_bootstrap_port):
            if port is None:
                continue
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((spec.host if spec else "127.0.0.1", int(port)))
                except OSError:
                    busy.append(f"{m.new_name} port {port}")
    if busy:
        raise LaunchError(f"ports the new layout needs are taken: {', '.join(busy)}; free them "
                          "or change ports.base in the topology, then plan again")


def _healthy(spec: WorkerSpec) -> bool:
    """One health probe. A probe to a port that nothing listens on yet can connect to itself
    (TCP self-connect: the port is in the ephemeral range) and read its own request back as a
    bad status line; that is "not ready yet", not an error."""
    try:
        return probe_health(spec.url, spec.health_path).ok
    except http.client.HTTPException:
        return False


def _specs(plan: Plan, worker: str) -> list[WorkerSpec]:
    specs = [w for w in plan.workers if w.name == worker or w.name.startswith(worker + ".r")]
    if not specs:
        raise LaunchError(f"worker {worker} is not in the rendered plan")
    return sorted(specs, key=lambda w: w.node_rank)


def _registries(plan: Plan, exclude: str) -> list[str]:
    """Every prefill leader's encoder registry (its encoder-bootstrap port, else its HTTP port)."""
    out = []
    for w in plan.workers:
        if w.role != "prefill" or not w.is_leader or w.name == exclude:
            continue
        if w.encoder_bootstrap_port:
            host = urlsplit(w.url).hostname or w.host
            host = f"[{host}]" if ":" in host else host
            out.append(f"http://{host}:{w.encoder_bootstrap_port}")
        else:
            out.append(w.url)
    return out
