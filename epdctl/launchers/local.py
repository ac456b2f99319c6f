"""Run workers as local processes, each in its own session and process group.

Why process groups: a worker may spawn helpers (smg starts threads, a runtime may fork), and
`down` must take the whole tree; the supervisor (supervise.py) leads the group. Why the
identity check: pids are reused and state files can be edited, and epdctl must never signal a
process it did not start; a group is only signalled while a member carries the recorded
``EPDCTL_TOKEN``. Pid files: ``clusters/<name>/run/<worker>.pid.json`` (the supervisor's).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import psutil

from epdctl.errors import LaunchError
from epdctl.launchers.streams import ProcessJobs
from epdctl.launchers import containers
from epdctl.launchers.base import (MARKER_CLUSTER, MARKER_TOKEN, MARKER_WORKER, SUPERVISOR,
                                   Results, Status, cluster_id, expand_argv, follow_file,
                                   new_token, read_pid_file, supervision_env, tail, worker_env)
from epdctl.preflight.runners import LocalRunner
from epdctl.state.store import Handle, ProcessRecord

logger = logging.getLogger(__name__)
_PYTHONS = {"python", "python3", sys.executable}
# psutil's create_time is btime + ticks since boot, and btime (whole seconds) flips by one when
# the clock is slewed. Only members without the token are judged by it.
BTIME_SLACK_S = 1.05


def resolve_argv(argv: tuple[str, ...]) -> list[str]:
    """Make argv[0] runnable here: `python` is this interpreter, tools are looked up beside it.

    A bare `smg` is found next to the running interpreter first (the project venv) so that a
    cluster uses the router that was installed with epdctl, not whatever is on PATH.
    """
    if not argv:
        raise LaunchError("empty command line in the plan")
    exe, rest = argv[0], list(argv[1:])
    if exe in _PYTHONS:
        return [sys.executable, *rest]
    if os.sep not in exe:
        beside = Path(sys.executable).parent / exe
        found = str(beside) if beside.exists() else shutil.which(exe)
        if not found:
            raise LaunchError(
                f"command {exe!r} not found next to {sys.executable} or on PATH; "
                f"install it (for the router: pip install 'epdctl[router]')"
            )
        return [found, *rest]
    return [exe, *rest]


class LocalLauncher:
    """Start/stop processes on this machine with subprocess; the state lives in records."""

    name = "local"
    runs_here = True
    nodes_known = True
    settle = 0.2       # seconds after a batch start before checking that nothing died at once

    def __init__(self, cluster_dir: Path | None = None, topology: Any = None,
                 accept_new_host_keys: bool = False):
        self.cluster_dir = cluster_dir
        self.cluster = cluster_id(cluster_dir)
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._marks: dict[tuple[int, float], str | None] = {}  # (pid, created) -> EPDCTL_TOKEN
        python = getattr(topology, "python", None)  # a bare python is the one epdctl runs in
        self.python = sys.executable if python in (None, "python", "python3") else str(python)

    # ---- contract ------------------------------------------------------------------------

    def start(self, recs: Sequence[ProcessRecord]) -> Results[Handle]:
        res: Results[Handle] = Results()
        for rec in recs:
            try:
                res.ok[rec.name] = self._start_one(rec)
            except LaunchError as e:
                res.failed[rec.name] = e
        if self.settle > 0 and res.ok:
            time.sleep(self.settle)
            for rec in recs:
                h = res.ok.get(rec.name)
                if h is not None and not self._members(h):
                    del res.ok[rec.name]
                    res.failed[rec.name] = self._died(rec, h, "right after start")
        return res

    def poll(self, recs: Sequence[ProcessRecord]) -> Results[Status]:
        res: Results[Status] = Results()
        groups = self._groups()
        for rec in recs:
            h = rec.handle
            alive = h is not None and bool(self._live(h, groups))
            restarts, last = read_pid_file(self.pid_file(rec), h.token) if h else (0, None)
            if alive or h is None:
                res.ok[rec.name] = Status(alive, None, "", restarts, last)
            else:
                res.ok[rec.name] = Status(False, self.exit_code(h), tail(Path(rec.log), 20),
                                          restarts, last)
        return res

    def stop(self, recs: Sequence[ProcessRecord], grace: float = 10.0) -> Results[None]:
        """SIGTERM all groups at once, wait up to ``grace``, SIGKILL stragglers, confirm."""
        res: Results[None] = Results()
        live = []
        for rec in recs:
            try:
                if rec.handle is not None and self._signal(rec.handle, signal.SIGTERM):
                    live.append(rec)
            except LaunchError as e:
                res.failed[rec.name] = e
        live = self._wait_gone(live, grace)
        for rec in live:
            logger.warning("%s did not stop within %.0fs; sending SIGKILL", rec.name, grace)
            assert rec.handle is not None
            self._signal(rec.handle, signal.SIGKILL)
        still = self._wait_gone(live, 5.0)
        res.failed.update({n: e for n, e in containers.remove([r for r in recs if r not in still]).items()
                           if n not in res.failed})
        for rec in recs:
            if rec in still:
                assert rec.handle is not None
                pids = ", ".join(str(p.pid) for p in self._members(rec.handle))
                res.failed[rec.name] = LaunchError(
                    f"[{rec.node}/{rec.name}] processes {pids} survived SIGKILL")
            elif rec.name not in res.failed:
                res.ok[rec.name] = None
        return res

    def logs(self, rec: ProcessRecord, lines: int = 40) -> str:
        return tail(Path(rec.log), lines)

    def follow(self, rec: ProcessRecord) -> Iterator[str]:
        return follow_file(Path(rec.log))

    def place(self, text: str) -> str:
        return text

    def node_jobs(self, nodes: Sequence[str]) -> Mapping[str, ProcessJobs]:
        """Every node is this machine."""
        return {n: ProcessJobs(n, self.python) for n in nodes}

    def node_runners(self, nodes: Sequence[str]) -> Mapping[str, LocalRunner]:
        """Every node is this machine."""
        return {n: LocalRunner(n, python=self.python) for n in nodes}

    def release(self) -> None:
        return None

    def holding(self, recs: Sequence[ProcessRecord]) -> None:
        return None

    def close(self) -> None:
        return None

    def orphans(self) -> list[ProcessRecord]:
        """Every process group on this machine whose members carry this cluster's marker."""
        cluster = self.cluster
        if not cluster:
            return []
        labelled = containers.labelled(self.cluster_dir.name, "local") if self.cluster_dir is not None else []
        groups: dict[int, list[tuple[psutil.Process, float, dict[str, str]]]] = {}
        for p in psutil.process_iter(["create_time", "status"]):
            try:
                if p.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                env = p.environ()
                if env.get(MARKER_CLUSTER) == cluster and env.get(MARKER_TOKEN):
                    groups.setdefault(os.getpgid(p.pid), []).append(
                        (p, p.info["create_time"], env))
            except (ProcessLookupError, psutil.Error, OSError):
                continue
        out = []
        for pgid, members in groups.items():
            lead, ct, env = min(members, key=lambda m: m[1])
            name = env.get(MARKER_WORKER) or f"pid-{lead.pid}"
            log = self.cluster_dir / "logs" / f"{name}.log" if self.cluster_dir else ""
            out.append(ProcessRecord(name=name, role="unknown", node="local", log=str(log),
                                     handle=Handle(pid=lead.pid, pgid=pgid, create_time=ct,
                                                   token=env[MARKER_TOKEN])))
        return out + labelled

    def pid_file(self, rec: ProcessRecord) -> Path:
        base = self.cluster_dir / "run" if self.cluster_dir is not None else Path(rec.log).parent
        return base / f"{rec.name}.pid.json"

    # ---- one process ---------------------------------------------------------------------

    def _start_one(self, rec: ProcessRecord) -> Handle:
        argv = resolve_argv(tuple(rec.argv))
        if not shutil.which(argv[0]):
            raise LaunchError(f"[{rec.node}/{rec.name}] cannot start {argv[0]}: no such "
                              f"executable file")
        real_argv = [sys.executable, *SUPERVISOR, *expand_argv(argv, rec.name)]
        token = new_token()
        env = worker_env(rec.env, rec.name, keys=rec.key_vars)
        pid_file = self.pid_file(rec)
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        env.update(supervision_env(self.cluster, rec, token, str(pid_file)))
        log = Path(rec.log)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            out.write(f"=== epdctl: starting {rec.name} at {time.strftime('%Y-%m-%d %H:%M:%S')}"
                      f" ===\n".encode())
            out.flush()
            try:
                proc = subprocess.Popen(
                    real_argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    env=env, start_new_session=True, close_fds=True,
                )
            except OSError as e:
                raise LaunchError(f"[{rec.node}/{rec.name}] cannot start {argv[0]}: {e}") from e
        self._children[proc.pid] = proc
        try:
            ctime = psutil.Process(proc.pid).create_time()
        except psutil.NoSuchProcess:
            ctime = time.time()
        logger.debug("started %s pid %d", rec.name, proc.pid)
        return Handle(pid=proc.pid, pgid=proc.pid, create_time=ctime, token=token)

    def exit_code(self, h: Handle) -> int | None:
        """The leader's exit status when this launcher started it and it has exited."""
        proc = self._children.get(h.pid)
        return proc.poll() if proc is not None else None

    def _died(self, rec: ProcessRecord, h: Handle, when: str) -> LaunchError:
        code = self.exit_code(h)
        how = f"exited with status {code}" if code is not None else "is no longer running"
        return LaunchError(f"[{rec.node}/{rec.name}] {how} {when}; last lines of {rec.log}:\n"
                           f"{tail(Path(rec.log), 20)}")

    def _groups(self) -> dict[int, list[tuple[psutil.Process, float]]]:
        """One scan of the process table: pgid -> live (process, create time)."""
        self._reap()
        out: dict[int, list[tuple[psutil.Process, float]]] = {}
        for p in psutil.process_iter(["create_time", "status"]):
            try:
                if p.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                out.setdefault(os.getpgid(p.pid), []).append((p, p.info["create_time"]))
            except (ProcessLookupError, psutil.Error):
                continue
        return out

    def _live(self, h: Handle, groups: dict[int, list[tuple[psutil.Process, float]]]
              ) -> list[psutil.Process]:
        """Members of the handle's group epdctl can prove it started: those carrying the recorded
        token, and those without it (a child that dropped its environment) created no earlier
        than the leader. The token, not create_time (wall clock: a step back makes our own
        process look older than its record), is the proof; no member carrying it: none."""
        if not h.token or not isinstance(h.pgid, int) or h.pgid <= 0:
            return []
        members = groups.get(h.pgid, [])
        marked = [p for p, ct in members if self._token(p, ct) == h.token]
        if not marked:
            return []
        return marked + [p for p, ct in members if p not in marked
                         and ct + BTIME_SLACK_S >= h.create_time]

    def _token(self, p: psutil.Process, ct: float) -> str | None:
        key = (p.pid, ct)
        if key not in self._marks:
            try:
                self._marks[key] = p.environ().get(MARKER_TOKEN)
            except (psutil.Error, OSError):
                return None
        return self._marks[key]

    def _members(self, h: Handle) -> list[psutil.Process]:
        return self._live(h, self._groups())

    def _signal(self, h: Handle, sig: int) -> bool:
        """Signal the group if it still has members we started; False when it is gone."""
        if not self._members(h):
            return False
        try:
            os.killpg(h.pgid, sig)
        except ProcessLookupError:
            return False
        except PermissionError as e:
            raise LaunchError(f"cannot signal process group {h.pgid}: {e}") from e
        return True

    def _wait_gone(self, recs: list[ProcessRecord], timeout: float) -> list[ProcessRecord]:
        deadline = time.monotonic() + timeout
        left = list(recs)
        while left:
            groups = self._groups()
            left = [r for r in left if r.handle is not None and self._live(r.handle, groups)]
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        return left

    def _reap(self) -> None:
        """Collect exit statuses of our own children so they do not linger as zombies."""
        for proc in self._children.values():
            proc.poll()

