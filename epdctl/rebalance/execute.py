"""Run a planned rebalance on a live cluster, one worker at a time, with rollback.

Per move: drain (out of the router / encoder registries, in-flight to zero) -> switch in place
where the engine can (``Engine.switch``), else stop -> start in
the new role through the cluster's launcher, with `up`'s own ``BringUp.start`` + ``wait`` (on
SLURM: a new job step in the running allocation) -> register (router
``POST /workers`` or every prefill's encoder registry) -> verify a real transfer through the
moved worker (canary answers well formed and its transport byte counters move) -> record.
If the new role does not come up (or moves no data), the worker is restarted in its old role,
re-registered and the move is recorded as ``rolled_back``. The state file is saved after every
start/stop so `status` and `down` always see the processes that really run.
"""

from __future__ import annotations

import logging
import os
import shlex
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from epdctl.engines import engine_of
from epdctl.errors import EpdctlError, LaunchError
from epdctl.launchers.base import Launcher
from epdctl.orchestrate.lifecycle import BringUp
from epdctl.rebalance import drain as dr
from epdctl.rebalance import history, links
from epdctl.rebalance import switch as sw
from epdctl.rebalance.plan import Move, RebalancePlan, apply_move
from epdctl.rebalance.steps import MoveResult, Step, Timer, summary
from epdctl.rebalance.targets import encoder_registries, extra_ports_free, worker_specs
from epdctl.render import build_plan
from epdctl.render.plan import Plan, ProcessSpec
from epdctl.topology.restart import RestartPolicy
from epdctl.http.routerctl import RouterClient
from epdctl.state.store import ClusterDir, ClusterState, ProcessRecord
from epdctl.topology.model import Topology

log = logging.getLogger(__name__)

# Test-only fault injection: extra argv tokens appended to a worker started in its NEW role, so
# the e2e test can make that start fail and exercise the rollback. Never set it in production.
INJECT_ENV = "EPDCTL_REBALANCE_TEST_INJECT_ARGS"


@dataclass
class Options:
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
        self.engine = engine_of(rp.before)
        router = state.router
        self.client = (RouterClient(router.url, state.api_key_env) if router is not None
                       else None)

    # -- the whole rebalance -------------------------------------------------------------------

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """Every move in order; stops at the first one that does not succeed. Returns the record."""
        record: dict[str, Any] = {
            "id": uuid.uuid4().hex[:12], "cluster": self.state.name, "who": history.who(),
            "started": time.time(), "request": request, "moves": []}
        if self.launcher.runs_here:
            extra_ports_free(self.rp)
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
        plan_old = build_plan(cur).placed(self.launcher.place)
        after = apply_move(cur, m)
        plan_new = build_plan(after).placed(self.launcher.place)
        old = worker_specs(plan_old, m.worker)
        new = worker_specs(plan_new, m.new_name)
        regs = encoder_registries(plan_old, exclude=m.worker)
        timed = Timer(res, label, self.on_step)
        undo: dict[str, Any] = {}
        try:
            with timed("drain"):
                undo = dr.drain(m.old_role, old[0].url, engine=self.engine,
                                client=self.client, registries=regs,
                                timeout=self.opts.drain_timeout, api_key_env=self.state.api_key_env)
        except EpdctlError as e:
            res.error = f"drain: {e}"
            self._undo_drain(m, old[0], regs, undo)
            res.outcome = "rolled_back"
            self.on_step(Step(label, "rollback", detail=res.error))
            return cur
        switched = m.path == "in-place" and self._in_place(m, old, new, res, timed)
        res.taken = "in-place" if switched else "restart"
        if not switched:
            with timed("stop"):
                self._stop(m.worker)
        try:
            if not switched:
                inject = shlex.split(os.environ.get(INJECT_ENV, ""))
                with timed("start"):
                    recs = self._start(new, inject)
                with timed("ready"):
                    self._bring_up.wait(recs)
            with timed("register"):
                self._register(m.new_role, new[0], encoder_registries(plan_new, exclude=m.new_name))
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

    def _in_place(self, m: Move, old: list[ProcessSpec], new: list[ProcessSpec], res: MoveResult,
                  timed: Timer) -> bool:
        """Switch the drained worker's role in its running process; False: restart it instead."""
        recs = self.state.ranks(m.worker)
        switch = self.engine.switch
        if not recs or switch is None or not recs[0].switchable:
            res.note = ("its process was not started switchable (rebalance.in_place is false, or "
                        "`up` ran before in place was the default: up again)")
            return False
        try:
            with timed("switch"):
                decodes = [p.url for p in self.state.processes
                           if p.role == "decode" and p.is_leader and p.worker != m.worker]
                sw.switch_role(switch.protocol, old[0].url, m.new_role, new[0].argv, decode_urls=decodes,
                               api_key_env=self.state.api_key_env, timeout=self.opts.ready_timeout)
                if switch.resumes_after:
                    dr.continue_generation(old[0].url)   # the drain paused it
        except EpdctlError as e:
            res.note = f"in-place switch failed, restarting instead: {summary(e)}"
            self.on_step(Step(f"{m.worker} -> {m.new_name}", "fallback", detail=res.note))
            return False
        self._rerecord(recs, new)
        return True

    def _rerecord(self, recs: list[ProcessRecord], new: list[ProcessSpec]) -> None:
        """The same processes, now recorded under their new role and command line."""
        for rec, spec in zip(recs, new):
            fresh = ProcessRecord.of(spec, self.state.engine, rec.log)
            fresh.handle, fresh.since = rec.handle, rec.since
            self.state.processes[self.state.processes.index(rec)] = fresh
        self.cdir.save(self.state)

    def _undo_drain(self, m: Move, spec: ProcessSpec, regs: list[str], undo: dict[str, Any]
                    ) -> None:
        """The worker is still running in its old role: put it back into service."""
        if undo.get("paused"):
            dr.continue_generation(spec.url)
        self._register(m.old_role, spec, regs)

    def _rollback(self, m: Move, new: list[ProcessSpec], old: list[ProcessSpec],
                  regs: list[str]) -> None:
        """Undo a failed start: stop the new role, start the old one, re-register it."""
        self._deregister(m.new_role, new[0], regs)
        self._stop(m.new_name)
        self._bring_up.wait(self._start(old, []))
        self._register(m.old_role, old[0], regs)

    # -- process control -----------------------------------------------------------------------

    @property
    def _bring_up(self) -> BringUp:
        return BringUp(self.launcher, self.cdir, self.state, timeout=self.opts.ready_timeout)

    def _stop(self, worker: str) -> None:
        recs = self.state.ranks(worker)
        if recs:
            self.launcher.stop(recs, grace=self.opts.grace).raise_if_failed(f"stopping {worker}")
        self.state.processes = [p for p in self.state.processes if p not in recs]
        self.cdir.save(self.state)

    def _start(self, specs: list[ProcessSpec], inject: list[str]) -> list[ProcessRecord]:
        """Start every rank of one worker (``inject``: test-only extra argv)."""
        recs = [ProcessRecord.of(s, self.state.engine, self.cdir.log(s.name)) for s in specs]
        for r in recs:
            r.argv += inject
            r.restart = next((dict(p.restart) for p in self.state.processes
                              if p.role == r.role and p.restart),
                             {**RestartPolicy().to_dict(), "standby": self.engine.warm_standby})
        self._bring_up.start(recs)
        return recs

    # -- registration --------------------------------------------------------------------------

    def _register(self, role: str, spec: ProcessSpec, regs: list[str]) -> None:
        """Into service in ``role``: the prefills' encoder registries, or the router (as the
        engine's router calls a worker of that role)."""
        if role == "encoder" and not self.engine.routed_encoders:
            dr.register_encoder(regs, spec.url, api_key_env=self.state.api_key_env)
            return
        kind = self.engine.router_type(role)
        if self.client is None or kind is None:
            return
        if self.client.find(spec.url) is None:
            wid = dr.router_add(self.client, spec.url, kind,
                                bootstrap_port=spec.bootstrap_port, model=self.opts.model,
                                timeout=self.opts.drain_timeout)
            rec = self.state.find(spec.name)
            if rec is not None:
                rec.router_id = wid
                self.cdir.save(self.state)

    def _deregister(self, role: str, spec: ProcessSpec, regs: list[str]) -> None:
        try:
            if role == "encoder" and not self.engine.routed_encoders:
                dr.unregister_encoder(regs, spec.url, self.state.api_key_env)
            elif self.client is not None:
                dr.router_remove(self.client, spec.url, timeout=self.opts.drain_timeout)
        except EpdctlError as e:
            log.warning("could not deregister %s before rollback: %s", spec.name, e)

    # -- link verification ---------------------------------------------------------------------

    def _verify(self, spec: ProcessSpec, role: str, plan: Plan) -> dict[str, Any]:
        router = self.state.router
        return links.verify(spec, role, plan, engine=self.engine, router_url=router.url if router else None,
                            model=self.opts.model, api_key_env=self.state.api_key_env,
                            attempts=self.opts.verify_attempts)
