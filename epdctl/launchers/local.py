"""Run workers as local processes, each in its own session and process group.

Why process groups: a worker may spawn helpers (smg starts threads, a runtime may fork), and
`down` must take the whole tree. Why the create-time check: pids are reused, and epdctl must
never signal a process it did not start; a group is only signalled while some member of it was
created at or after the recorded start of its leader.
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
from typing import Iterable

import psutil

from epdctl.errors import LaunchError
from epdctl.launchers.base import Handle, LaunchSpec, Results, expand_argv, expand_env, tail

logger = logging.getLogger(__name__)
_PYTHONS = {"python", "python3", sys.executable}


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
    """Start/stop processes on this machine with subprocess; state lives in Handles."""

    name = "local"

    def __init__(self, settle: float = 0.2):
        self.settle = settle
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, spec: LaunchSpec, log: Path) -> Handle:
        argv = resolve_argv(spec.argv)  # recorded as is: ${VAR} references, never values
        real_argv = expand_argv(argv, spec.name)
        env = dict(os.environ)
        env.update(expand_env(spec.env, spec.name))
        env.setdefault("PYTHONUNBUFFERED", "1")
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            out.write(f"=== epdctl: starting {spec.name} at {time.strftime('%Y-%m-%d %H:%M:%S')}"
                      f" ===\n".encode())
            out.flush()
            try:
                proc = subprocess.Popen(
                    real_argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    env=env, start_new_session=True, close_fds=True,
                )
            except OSError as e:
                raise LaunchError(f"[{spec.node}/{spec.name}] cannot start {argv[0]}: {e}") from e
        self._children[proc.pid] = proc
        try:
            ctime = psutil.Process(proc.pid).create_time()
        except psutil.NoSuchProcess:
            ctime = time.time()
        handle = Handle(name=spec.name, role=spec.role, node=spec.node, pid=proc.pid,
                        pgid=proc.pid, create_time=ctime, log=log, since=time.time(),
                        argv=tuple(argv))
        logger.debug("started %s pid %d", spec.name, proc.pid)
        if self.settle > 0:
            time.sleep(self.settle)
            self.raise_if_dead(handle)
        return handle

    def exit_code(self, handle: Handle) -> int | None:
        """The leader's exit status when this launcher started it and it has exited."""
        proc = self._children.get(handle.pid)
        return proc.poll() if proc is not None else None

    def raise_if_dead(self, handle: Handle, n: int = 20) -> None:
        """LaunchError with the exit status and the log tail if the worker is gone."""
        if self.is_alive(handle):
            return
        code = self.exit_code(handle)
        how = f"exited with status {code}" if code is not None else "is no longer running"
        text = tail(handle.log, n)
        raise LaunchError(
            f"[{handle.node}/{handle.name}] {how}; last lines of {handle.log}:\n{text}"
        )

    def members(self, handle: Handle) -> list[psutil.Process]:
        """Live processes of the handle's group that epdctl can prove it started."""
        self._reap()
        found: list[psutil.Process] = []
        for p in psutil.process_iter(["create_time", "status"]):
            try:
                if p.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                if p.info["create_time"] + 0.05 < handle.create_time:
                    continue
                if os.getpgid(p.pid) == handle.pgid:
                    found.append(p)
            except (ProcessLookupError, psutil.Error):
                continue
        return found

    def is_alive(self, handle: Handle) -> bool:
        return bool(self.members(handle))

    def stop(self, handles: Iterable[Handle], grace: float = 10.0) -> Results[None]:
        """SIGTERM all groups at once, wait up to ``grace``, SIGKILL stragglers, confirm."""
        handles = list(handles)
        res: Results[None] = Results()
        live = [h for h in handles if self._signal(h, signal.SIGTERM)]
        for h in handles:
            if h not in live:
                res.ok[h.name] = None
        live = self._wait_gone(live, grace)
        for h in live:
            logger.warning("%s did not stop within %.0fs; sending SIGKILL", h.name, grace)
            self._signal(h, signal.SIGKILL)
        still = self._wait_gone(live, 5.0)
        for h in handles:
            if h in still:
                pids = ", ".join(str(p.pid) for p in self.members(h))
                res.failed[h.name] = LaunchError(
                    f"[{h.node}/{h.name}] processes {pids} survived SIGKILL")
            elif h.name not in res.ok:
                res.ok[h.name] = None
        return res

    def _signal(self, handle: Handle, sig: int) -> bool:
        """Signal the group if it still has members we started; False when it is gone."""
        if not self.members(handle):
            return False
        try:
            os.killpg(handle.pgid, sig)
        except ProcessLookupError:
            return False
        except PermissionError as e:
            raise LaunchError(f"[{handle.node}/{handle.name}] cannot signal group "
                              f"{handle.pgid}: {e}") from e
        return True

    def _wait_gone(self, handles: list[Handle], timeout: float) -> list[Handle]:
        deadline = time.monotonic() + timeout
        left = list(handles)
        while left:
            left = [h for h in left if self.members(h)]
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        return left

    def _reap(self) -> None:
        """Collect exit statuses of our own children so they do not linger as zombies."""
        for proc in self._children.values():
            proc.poll()
