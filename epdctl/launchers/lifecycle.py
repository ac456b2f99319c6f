"""Bring a planned cluster up role by role, and take a recorded one down.

Why role by role: a prefill needs its encoders reachable and the router needs its prefill and
decode workers; waiting for each role's `/health` before starting the next turns "the router
says no healthy workers" into "encoder-1 died: <its log>". Every start is recorded on disk at
once, so a crash or Ctrl-C of epdctl itself still leaves `down` something to stop.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from epdctl.errors import LaunchError
from epdctl.launchers.base import Handle, LaunchSpec, Launcher, Results, tail
from epdctl.probes import Health, probe_health
from epdctl.routerctl import RouterClient, with_local_health_flags
from epdctl.state import ClusterDir, ClusterState, ProcessRecord

log = logging.getLogger(__name__)
ROLE_ORDER = ("encoder", "prefill", "decode", "colocated")


@dataclass(frozen=True)
class Event:
    """Progress of `up`, for the command to display."""

    stage: str            # role name or "router"
    kind: str             # starting | waiting | ready | registered
    ready: int = 0
    total: int = 0
    elapsed: float = 0.0
    detail: str = ""


OnEvent = Callable[[Event], None]


def to_handle(rec: ProcessRecord) -> Handle:
    """Rebuild a launcher handle from what is on disk."""
    return Handle(name=rec.name, role=rec.role, node=rec.node, pid=rec.pid, pgid=rec.pgid,
                  create_time=rec.create_time, log=Path(rec.log), since=rec.since,
                  argv=tuple(rec.argv))


def _record(h: Handle, spec: Any) -> ProcessRecord:
    return ProcessRecord(
        name=h.name, role=h.role, node=h.node, host=spec.host, port=int(spec.port),
        url=spec.url, pid=h.pid, pgid=h.pgid, create_time=h.create_time, log=str(h.log),
        since=h.since, argv=list(h.argv), health_path=getattr(spec, "health_path", "/health"),
        bootstrap_port=getattr(spec, "bootstrap_port", None),
        is_leader=bool(getattr(spec, "is_leader", True)),
    )


def _drop_api_key(flags: list[str]) -> tuple[list[str], str | None]:
    """Remove a rendered ``--api-key ${VAR}`` pair; return the flags and VAR."""
    out, env_name, i = [], None, 0
    while i < len(flags):
        if flags[i] == "--api-key" and i + 1 < len(flags):
            ref = flags[i + 1]
            env_name = ref[2:-1] if ref.startswith("${") and ref.endswith("}") else None
            if env_name is None:
                raise LaunchError("the plan puts a literal router API key on the command line; "
                                  "name an env var in the topology (router.api_key_env) instead")
            i += 2
            continue
        out.append(flags[i])
        i += 1
    return out, env_name


def router_argv(spec: Any) -> tuple[str, ...]:
    """The router's command with fast local health checks and the API key kept off argv.

    The key comes from the env var the topology names. Instead of `--api-key VALUE` on the
    command line (readable by every user via ps), smg is started through a tiny Python wrapper
    that reads the variable and hands the flag to smg's own launcher in-process.
    """
    argv = list(spec.argv)
    if argv[:1] == ["smg"] and argv[1:2] == ["launch"]:
        prog, flags, python = argv[:2], argv[2:], "python3"
    elif len(argv) >= 3 and argv[1:3] == ["-m", "smg.launch_router"]:
        prog, flags, python = argv[:3], argv[3:], argv[0]
    else:  # another router (sglang-router): the launcher expands ${VAR} in argv
        return tuple(with_local_health_flags(argv))
    flags, rendered_env = _drop_api_key(with_local_health_flags(flags))
    env_name = getattr(spec, "api_key_env", None) or rendered_env
    if not env_name:
        return (*prog, *flags)
    wrapper = (
        "import os, sys\n"
        "from smg.launch_router import launch_router, parse_router_args\n"
        f"key = os.environ.get({env_name!r})\n"
        f"if not key: sys.exit('error: environment variable {env_name} (router API key) is "
        "empty or not set')\n"
        "launch_router(parse_router_args(sys.argv[1:] + ['--api-key', key]))\n"
    )
    return (python, "-c", wrapper, *flags)


class BringUp:
    """One `up`: starts processes, records them, waits, and stops them all on failure."""

    def __init__(self, plan: Any, launcher: Launcher, cdir: ClusterDir, state: ClusterState,
                 *, timeout: float = 300.0, on_event: OnEvent | None = None):
        self.plan = plan
        self.launcher = launcher
        self.cdir = cdir
        self.state = state
        self.timeout = timeout
        self.on_event = on_event or (lambda e: None)
        self.handles: list[Handle] = []

    def run(self) -> ClusterState:
        """Start everything; on any failure (Ctrl-C included) stop what was started."""
        try:
            for role in ROLE_ORDER:
                specs = [w for w in self.plan.workers if w.role == role]
                if specs:
                    self._start_role(role, specs)
            if self.plan.router is not None:
                self._start_router(self.plan.router)
        except LaunchError as e:
            res = self.abort()
            note = (f"stopped the {len(self.handles)} process(es) this run had started"
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
        """Stop everything this run started and forget the state."""
        res = self.launcher.stop(self.handles, grace=15.0)
        if res.all_ok:
            self.cdir.clear()
        return res

    def _start(self, spec: Any, launch: LaunchSpec) -> Handle:
        h = self.launcher.start(launch, self.cdir.log(launch.name))
        self.handles.append(h)
        self.state.processes.append(_record(h, spec))
        self.cdir.save(self.state)
        return h

    def _start_role(self, role: str, specs: list[Any]) -> None:
        self.on_event(Event(role, "starting", 0, len(specs)))
        started = [(s, self._start(s, LaunchSpec.of(s))) for s in specs]
        self._wait_healthy(role, started)

    def _wait_healthy(self, stage: str, started: list[tuple[Any, Handle]]) -> None:
        t0 = time.monotonic()
        pending = {h.name: (s, h) for s, h in started}
        last: dict[str, Health] = {}
        while pending:
            for name, (spec, h) in list(pending.items()):
                self._check_alive(h)
                if not getattr(spec, "is_leader", True):
                    del pending[name]  # non-leader ranks serve no HTTP; alive is enough
                    continue
                last[name] = probe_health(spec.url, getattr(spec, "health_path", "/health"))
                if last[name].ok:
                    del pending[name]
            elapsed = time.monotonic() - t0
            self.on_event(Event(stage, "waiting", len(started) - len(pending), len(started),
                                elapsed))
            if not pending:
                break
            if elapsed > self.timeout:
                name, (_, h) = next(iter(pending.items()))
                why = last[name].detail if name in last else "no answer"
                raise LaunchError(
                    f"[{h.node}/{name}] not healthy after {self.timeout:.0f}s ({why}); "
                    f"raise --timeout if it is still loading. Last lines of {h.log}:\n"
                    f"{tail(h.log, 15)}")
            time.sleep(0.5)
        self.on_event(Event(stage, "ready", len(started), len(started), time.monotonic() - t0))

    def _check_alive(self, h: Handle) -> None:
        if self.launcher.is_alive(h):
            return
        code = getattr(self.launcher, "exit_code", lambda _h: None)(h)
        how = f"exited with status {code}" if code is not None else "died"
        raise LaunchError(f"[{h.node}/{h.name}] {how} during startup; last lines of {h.log}:\n"
                          f"{tail(h.log, 20)}")

    def _start_router(self, spec: Any) -> None:
        self.on_event(Event("router", "starting", 0, 1))
        launch = LaunchSpec(name="router", role="router", node=spec.node,
                            argv=router_argv(spec), env=dict(spec.env or {}))
        h = self._start(spec, launch)
        client = RouterClient(spec.url, getattr(spec, "api_key_env", None))
        t0 = time.monotonic()
        while not client.alive():
            self._check_alive(h)
            if time.monotonic() - t0 > self.timeout:
                raise LaunchError(f"[{h.node}/router] not answering /health after "
                                  f"{self.timeout:.0f}s; last lines of {h.log}:\n{tail(h.log)}")
            time.sleep(0.3)
        if not any(f in spec.argv for f in ("--prefill", "--decode", "--worker-urls")):
            self._register(client)
        while True:
            self._check_alive(h)
            ok, doc = client.readiness()
            elapsed = time.monotonic() - t0
            self.on_event(Event("router", "waiting", int(ok), 1, elapsed,
                                str(doc.get("reason", doc.get("status", "")))))
            if ok:
                break
            if elapsed > self.timeout:
                raise LaunchError(f"[{h.node}/router] not ready after {self.timeout:.0f}s "
                                  f"({doc}); check `epdctl logs router` and the workers' logs")
            time.sleep(0.5)
        self.on_event(Event("router", "ready", 1, 1, time.monotonic() - t0))

    def _register(self, client: RouterClient) -> None:
        """Register leader prefill/decode (or colocated) workers through `POST /workers`."""
        kinds = {"prefill": "prefill", "decode": "decode", "colocated": "regular"}
        for w in self.plan.workers:
            if w.role not in kinds or not getattr(w, "is_leader", True):
                continue
            wid = client.add_worker(w.url, kinds[w.role], bootstrap_port=w.bootstrap_port,
                                    model=self.state.model)
            rec = self.state.find(w.name)
            if rec is not None:
                rec.router_id = wid
            self.on_event(Event("router", "registered", detail=f"{w.name} -> {wid}"))
        self.cdir.save(self.state)


def tear_down(state: ClusterState, launcher: Launcher, grace: float = 15.0) -> Results[None]:
    """Stop every recorded process group (all at once: smg alone takes 5-8 s to exit)."""
    return launcher.stop([to_handle(p) for p in state.processes], grace=grace)
