"""The per-process supervisor: runs one worker (or the router), restarts it on failure.

Launchers start ``python -m epdctl.node.supervise -- ARGV...`` (local, SSH, inside a SLURM
step). Supervisor and worker share one process group, the worker dies with it (PDEATHSIG), and
both carry ``EPDCTL_CLUSTER``/``EPDCTL_WORKER``/``EPDCTL_TOKEN``, by which `down` finds them.
Settings come from the environment: ``EPDCTL_RESTART`` (policy, limit, backoff),
``EPDCTL_HEALTH_URL``, ``EPDCTL_PID_FILE`` (pids, restarts, last exit cause), ``EPDCTL_ROUTER``.
A worker is restarted only once it has been healthy: armed by the byte it writes to
``EPDCTL_READY_FD`` before it first answers (the embedded runtime), read again at its exit, or
by a good probe (every 0.25 s while it starts). With ``standby`` in the policy (embedded workers,
whose runtime honours ``EPDCTL_STANDBY_FD``: epdctl/runtime/standby.py) a spare copy of the
command is started once the worker has been healthy for a few seconds; it imports everything and
waits, and a restart hands over to it (one byte on its pipe) instead of starting cold. A router is restarted with every worker it had
(its ``GET /workers``, read every 2 s once all its command's workers are on it), so workers that
`rebalance` added or removed stay so. docs/reliability.md has the why. Stdlib only.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any

MAX_BACKOFF_S = 30.0
STABLE_S = 60.0          # a run this long resets the back-off and the limit's count
ARM_WITHOUT_HEALTH_S = 10.0
SNAPSHOT_EVERY_S = 2.0   # a router's worker list copied this often
PROBE_EVERY_S = 0.25     # while starting; nothing is probed once the worker has been healthy
READY_FD_ENV = "EPDCTL_READY_FD"
STANDBY_FD_ENV = "EPDCTL_STANDBY_FD"
STANDBY_AFTER_S = 10.0   # healthy this long before its spare starts (not while `up` loads every role)
STANDBY_TRIES = 3        # spares that may die before the supervisor stops making them
_stopping = False


def _pdeathsig() -> None:
    """In the child: die with SIGKILL when the supervisor dies (Linux prctl)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def describe(rc: int) -> str:
    """An exit status as a person reads it."""
    if rc < 0:
        try:
            return f"killed by signal {-rc} ({signal.Signals(-rc).name})"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with status {rc}"


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as r:  # noqa: S310 (the worker's own URL)
            return 200 <= r.status < 300
    except Exception:  # noqa: any failure is "not yet"
        return False


def _notified(fd: int, byte: bytes = b"R") -> bool:
    """True when the worker wrote ``byte`` into the pipe (non-blocking read): R, ready to serve;
    S, a spare whose imports are done."""
    try:
        return byte in os.read(fd, 64)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
            return False
        raise


def _start(argv: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    """The worker, with the write end of a fresh ready pipe; returns it and the read end."""
    proc, r, _ = _spawn(argv, standby=False)
    return proc, r


class Spare:
    """A started copy of the command waiting on its go pipe (``go``: the write end)."""

    def __init__(self, argv: list[str]):
        self.proc, self.ready_fd, go = _spawn(argv, standby=True)
        assert go is not None
        self.go_fd = go
        self.loaded = False   # it said its imports are done

    def take(self) -> tuple[subprocess.Popen[bytes], int] | None:
        """Tell it to go on; its process and ready pipe, or None when it is gone."""
        try:
            if self.proc.poll() is None:
                os.write(self.go_fd, b"G")
                return self.proc, self.ready_fd
        except OSError:
            pass
        finally:
            os.close(self.go_fd)
        self._reap()
        return None

    def drop(self) -> None:
        """Stand it down (EOF on its pipe ends it; SIGTERM if it does not go)."""
        os.close(self.go_fd)
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
        self._reap()

    def _reap(self) -> None:
        os.close(self.ready_fd)
        try:
            self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _spawn(argv: list[str], standby: bool) -> tuple[subprocess.Popen[bytes], int, int | None]:
    """``argv`` with the write end of a fresh ready pipe (and, for a spare, the read end of its go
    pipe); returns it, the ready pipe's read end and the go pipe's write end."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    go_r, go_w = os.pipe() if standby else (-1, None)
    extra = {READY_FD_ENV: str(w), **({STANDBY_FD_ENV: str(go_r)} if standby else {})}
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=_pdeathsig,
                                pass_fds=(w, go_r) if standby else (w,), env=dict(os.environ, **extra))
    except BaseException:
        os.close(r)
        if go_w is not None:
            os.close(go_w)
        raise
    finally:
        os.close(w)
        if standby:
            os.close(go_r)
    return proc, r, go_w


def _router_key(argv: list[str]) -> str | None:
    """The cluster's key when the router reads it (``-m epdctl.node.router_exec VAR ...``)."""
    for i, a in enumerate(argv[:-1]):
        if a == "epdctl.node.router_exec" and i > 0 and argv[i - 1] == "-m":
            return os.environ.get(argv[i + 1]) or None
    return None


def router_workers(base: str, key: str | None) -> list[dict[str, Any]] | None:
    """The router's workers (url, worker_type, bootstrap_port); None when it cannot tell now."""
    req = urllib.request.Request(base + "/workers", headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=2.0) as r:  # noqa: S310 (the router's own URL)
            doc = json.loads(r.read())
        return [{"url": str(w["url"]), "worker_type": str(w.get("worker_type") or "regular"),
                 "bootstrap_port": w.get("bootstrap_port")}
                for w in doc["workers"] if w.get("worker_type") in ("prefill", "decode", "regular", None)]
    except Exception:  # noqa: unreachable, refused, not JSON: keep the last good copy
        return None


def argv_urls(argv: list[str]) -> set[str]:
    """The worker URLs a router command names (``--prefill``/``--decode``/``--worker-urls``)."""
    out, flag = set(), ""
    for a in argv:
        if a in ("--prefill", "--decode", "--worker-urls"):
            flag = a
        elif a.startswith("--"):
            flag = ""
        elif flag and "://" in a:
            out.add(a.rstrip("/"))
            flag = flag if flag == "--worker-urls" else ""
    return out


def with_workers(argv: list[str], workers: list[dict[str, Any]]) -> list[str]:
    """``argv`` with its ``--prefill URL [PORT]``, ``--decode URL`` and ``--worker-urls URL...``
    replaced by ``workers`` (inserted where the first of them was)."""
    out: list[str] = []
    at, i = None, 0
    while i < len(argv):
        a = argv[i]
        if a in ("--prefill", "--decode", "--worker-urls"):
            at = len(out) if at is None else at
            i += 2
            if a == "--prefill" and i < len(argv) and (argv[i].isdigit() or argv[i] == "none"):
                i += 1
            while a == "--worker-urls" and i < len(argv) and not argv[i].startswith("--"):
                i += 1
            continue
        out.append(a)
        i += 1
    flags: list[str] = []
    for w in workers:
        if w["worker_type"] == "prefill":
            port = w.get("bootstrap_port")
            flags += ["--prefill", w["url"], str(port) if isinstance(port, int) else "none"]
        elif w["worker_type"] == "decode":
            flags += ["--decode", w["url"]]
    regular = [w["url"] for w in workers if w["worker_type"] == "regular"]
    if regular:
        flags += ["--worker-urls", *regular]
    if at is None:
        return out + flags
    return out[:at] + flags + out[at:]


def _write(path: str | None, doc: dict[str, Any]) -> None:
    if not path:
        return
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass


def _say(text: str) -> None:
    sys.stdout.write(f"=== epdctl supervisor: {text} at {time.strftime('%Y-%m-%d %H:%M:%S')} ===\n")
    sys.stdout.flush()


def _on_signal(child: list[subprocess.Popen[bytes]]) -> Any:
    def handler(sig: int, _frame: Any) -> None:
        global _stopping
        _stopping = True
        for p in child:
            if p.poll() is None:
                try:
                    p.send_signal(sig)
                except ProcessLookupError:
                    pass
    return handler


def supervise(argv: list[str], policy: dict[str, Any], health: str | None,
              pid_file: str | None) -> int:
    """Run ``argv`` until it exits for good; the exit status to leave with."""
    mode = str(policy.get("policy", "never"))
    limit, backoff = int(policy.get("limit", 5)), float(policy.get("backoff", 1.0))
    current: list[subprocess.Popen[bytes]] = []
    handler = _on_signal(current)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, handler)
    doc: dict[str, Any] = {
        "cluster": os.environ.get("EPDCTL_CLUSTER", ""), "worker": os.environ.get("EPDCTL_WORKER", ""),
        "token": os.environ.get("EPDCTL_TOKEN", ""), "pid": os.getpid(), "pgid": os.getpgid(0),
        "policy": mode, "limit": limit, "restarts": 0, "last_exit": None, "state": "starting"}
    streak, ever = 0, False   # ever: healthy once; from then on every run may restart
    router = os.environ.get("EPDCTL_ROUTER") == "1" and bool(health)
    base = "/".join((health or "").split("/")[:3])
    key, next_snap = _router_key(argv), 0.0
    known: list[dict[str, Any]] = []
    spare: Spare | None = None
    spares_left = STANDBY_TRIES if policy.get("standby") is True and not router else 0
    taken: tuple[subprocess.Popen[bytes], int] | None = None
    while True:
        if router and doc["restarts"] and known:
            argv = with_workers(argv, known)
            _say(f"router restarts with the {len(known)} worker(s) it had: "
                 + " ".join(f"{w['worker_type']}={w['url']}" for w in known))
        try:
            proc, ready_fd = taken or _start(argv)
            taken = None
        except OSError as e:
            _say(f"cannot start {argv[0]}: {e}")
            doc.update(state="exited", last_exit=f"cannot start: {e}")
            _write(pid_file, doc)
            return 127
        current[:] = [proc] + ([spare.proc] if spare else [])
        started, armed, up = time.monotonic(), ever, False  # up: healthy in this run
        healthy_at = 0.0
        settled = not router  # a router's list counts once every worker it was started with is on it
        doc.update(child_pid=proc.pid, since=time.time(), state="starting")
        _write(pid_file, doc)
        next_probe = 0.0
        try:
            while True:
                exited = proc.poll() is not None
                if not up and not _stopping:
                    # the ready byte is read again after the exit: a worker healthy once is armed
                    now = time.monotonic()
                    if _notified(ready_fd):
                        up = True
                    elif exited:
                        pass
                    elif health and now >= next_probe:
                        up, next_probe = _healthy(health), now + PROBE_EVERY_S
                    elif not health and now - started >= ARM_WITHOUT_HEALTH_S:
                        up = True
                    if up:
                        armed = ever = True
                        healthy_at = time.monotonic()
                        doc["state"] = "running"
                        _write(pid_file, doc)
                if exited:
                    break
                if spare is not None and not spare.loaded and _notified(spare.ready_fd, b"S"):
                    spare.loaded = doc["standby_ready"] = True
                    _write(pid_file, doc)
                if spare is not None and spare.proc.poll() is not None:
                    spare.drop()   # a spare that died (out of memory?): try again, a few times
                    spare, doc["standby_pid"], doc["standby_ready"] = None, None, False
                    _write(pid_file, doc)
                if (up and spare is None and spares_left and not _stopping
                        and time.monotonic() - healthy_at >= STANDBY_AFTER_S):
                    try:
                        spare = Spare(argv)
                    except OSError:
                        spares_left = 0
                    else:
                        spares_left -= 1
                        current.append(spare.proc)
                        doc["standby_pid"], doc["standby_ready"] = spare.proc.pid, False
                        _write(pid_file, doc)
                if up and router and time.monotonic() >= next_snap:
                    listed = router_workers(base, key)
                    urls = {w["url"].rstrip("/") for w in listed or []}
                    settled = settled or (bool(listed) and argv_urls(argv) <= urls)
                    known = listed if listed and settled else known  # never a list still registering
                    next_snap = time.monotonic() + SNAPSHOT_EVERY_S
                time.sleep(0.05 if not up else 0.2)
        finally:
            os.close(ready_fd)
        rc = proc.returncode
        cause = describe(rc)
        doc["last_exit"] = cause
        ran = time.monotonic() - started
        streak = 0 if ran >= STABLE_S else streak
        again = (not _stopping and armed and streak < limit
                 and (mode == "always" or (mode == "on-failure" and rc != 0)))
        if not again:
            why = ("stopped" if _stopping else f"{cause}; no restart ("
                   + ("policy never" if mode == "never" else
                      "it never became healthy" if not armed else
                      f"limit of {limit} restarts reached" if streak >= limit else "clean exit")
                   + ")")
            if not _stopping and armed and mode != "never":  # else the launcher reports it
                _say(f"{doc['worker'] or argv[0]} {why}")
            if spare is not None:
                spare.drop()
            doc["state"] = "stopped" if _stopping else "exited"
            _write(pid_file, doc)
            return rc if rc >= 0 else 128 - rc
        delay = min(backoff * (2 ** streak), MAX_BACKOFF_S)
        streak += 1
        doc["restarts"] += 1
        doc["state"] = "backoff"
        _write(pid_file, doc)
        _say(f"{doc['worker'] or argv[0]} {cause}; restart {streak}/{limit} in {delay:.1f}s")
        until = time.monotonic() + delay
        while time.monotonic() < until and not _stopping:
            time.sleep(0.05)
        if _stopping:
            if spare is not None:
                spare.drop()
            doc["state"] = "stopped"
            _write(pid_file, doc)
            return rc if rc >= 0 else 128 - rc
        if spare is not None:   # hand over to the spare: its imports are done
            taken, spare, doc["standby_pid"], doc["standby_ready"] = spare.take(), None, None, False
            if taken is not None:
                spares_left = STANDBY_TRIES
                _say(f"{doc['worker'] or argv[0]} continues in its standby process {taken[0].pid}")


def main(args: list[str]) -> int:
    if "--" in args:
        args = args[args.index("--") + 1:]
    if not args:
        sys.stderr.write("usage: python -m epdctl.node.supervise -- COMMAND [ARGS...]\n")
        return 2
    try:
        policy = json.loads(os.environ.get("EPDCTL_RESTART") or "{}")
    except ValueError:
        policy = {}
    return supervise(args, policy if isinstance(policy, dict) else {},
                     os.environ.get("EPDCTL_HEALTH_URL") or None,
                     os.environ.get("EPDCTL_PID_FILE") or None)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
