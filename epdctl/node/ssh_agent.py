"""The node side of the ssh launcher: a stdlib-only script piped to the node's python.

Why a script on stdin rather than shell one-liners: start, poll and stop need exact process
identity (pid + start time + process group), atomic record files and JSON answers, which are
fragile in sh and identical in Python on every Linux node. Why stdin: nothing is installed or
left on the node except the run folder, and environment values (which may hold tokens) never
appear on a command line that `ps` shows.

The launcher starts it once per node and connection (``python -S``, the program's size, then the
program on stdin, then one JSON request per line: ``_serve``) and reuses it for every call; each
answer is one stdout line prefixed with ``EPDCTL-AGENT`` (``node_source``: this file after the process-identity
helpers of ``ssh_agent_procs.py``). Setup lines run before it in the same shell, so their
``export``s reach the workers. It must not import epdctl (except to report its version).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

if __package__:  # in the package; on the node, ssh_agent_procs' source precedes this one
    from epdctl.node.ssh_agent_procs import (  # noqa: F401
        _create_time, _expand, _marker, _members, _same, _stat, _tail, _write_json)

MARK = "EPDCTL-AGENT "
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def op_prepare(req):
    folder = _expand(req["dir"])
    os.makedirs(folder, mode=0o700, exist_ok=True)
    try:
        if sys.flags.no_site:  # the agent runs without site (-S); the node's epdctl lives there
            import site
            site.main()
        import epdctl  # noqa: the only epdctl import: which version would run the workers
        version, problem = getattr(epdctl, "__version__", None), None
    except Exception as e:  # noqa: a missing or broken install is reported, not raised
        version, problem = None, "%s: %s" % (type(e).__name__, e)
    return {"version": version, "problem": problem, "python": sys.executable,
            "hostname": socket.gethostname(), "dir": folder}


def _env(spec):
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    for key, value in spec.get("env", {}).items():
        missing = [v for v in _VAR.findall(value) if v not in os.environ]
        if missing:
            raise ValueError("environment variable %s (used by %s) is set neither on the "
                             "machine running epdctl nor on this node" % (missing[0], key))
        env[key] = _VAR.sub(lambda m: os.environ[m.group(1)], value)
    return env


def _supervisor(folder, source):
    """The supervisor script (node/supervise.py, sent with the request) in the run folder:
    the node runs exactly the supervisor of the epdctl that starts it."""
    path = os.path.join(folder, "epdctl-supervise.py")
    try:
        with open(path) as f:
            if f.read() == source:
                return path
    except OSError:
        pass
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        f.write(source)
    os.replace(tmp, path)
    return path


def _start_one(folder, spec, supervisor):
    name = spec["name"]
    log = os.path.join(folder, name + ".log")
    env = _env(spec)
    env["EPDCTL_PID_FILE"] = os.path.join(folder, name + ".pid.json")
    if not shutil.which(spec["argv"][0], path=env.get("PATH")):  # as exec would find it
        raise OSError(2, "No such file or directory (or not executable)", spec["argv"][0])
    argv = [sys.executable, "-S", supervisor, "--"] + list(spec["argv"])  # stdlib only: no site
    with open(log, "ab") as out:
        out.write(("=== epdctl: starting %s on %s at %s ===\n"
                   % (name, socket.gethostname(), time.strftime("%Y-%m-%d %H:%M:%S"))).encode())
        out.flush()
        # setsid + nohup, in Python: a new session (pid == pgid == sid, no controlling terminal,
        # so no SIGHUP when the ssh session ends), stdin from /dev/null, output to the log.
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                close_fds=True, cwd=spec.get("cwd") or os.path.expanduser("~"))
    st = _stat(proc.pid)
    ticks = st[2] if st else 0
    rec = {"name": name, "pid": proc.pid, "pgid": proc.pid, "start_ticks": ticks,
           "create_time": _create_time(ticks), "since": time.time(), "log": log,
           "argv": spec["argv"], "env_keys": sorted(spec.get("env", {})),
           "token": env.get("EPDCTL_TOKEN"),
           "ports": spec.get("ports", [])}
    _write_json(os.path.join(folder, name + ".json"), rec)
    return proc, rec


def op_start(req):
    folder = _expand(req["dir"])
    os.makedirs(folder, mode=0o700, exist_ok=True)
    out, procs = {}, {}
    supervisor = _supervisor(folder, req["supervisor"])
    for spec in req["workers"]:
        try:
            procs[spec["name"]], out[spec["name"]] = _start_one(folder, spec, supervisor)
        except (OSError, ValueError) as e:
            out[spec["name"]] = {"error": "cannot start %s: %s" % (spec["argv"][0], e)}
    deadline = time.monotonic() + float(req.get("settle", 0))
    while procs and time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs.values()):
            break
        time.sleep(0.05)
    for name, proc in procs.items():
        rc = proc.poll()
        if rc is not None:
            out[name].update(alive=False, rc=rc, tail=_tail(out[name]["log"], req.get("lines", 20)))
        else:
            out[name]["alive"] = True
    return {"workers": out}


def op_poll(req):
    out = {}
    for rec in req["workers"]:
        alive = _same(rec)
        entry = {"alive": alive, "members": len(_members(rec))}
        sup = _read(os.path.join(os.path.dirname(_expand(rec["log"])), rec["name"] + ".pid.json"))
        if sup.get("token") and sup.get("token") == rec.get("token"):
            entry.update(restarts=sup.get("restarts", 0), last_exit=sup.get("last_exit"))
        if not alive:
            entry["tail"] = _tail(_expand(rec["log"]), req.get("lines", 20))
        elif req.get("peek"):  # what a starting worker is doing (its last log lines)
            entry["peek"] = _tail(_expand(rec["log"]), int(req["peek"]))
        out[rec["name"]] = entry
    return {"workers": out}


def _signal_groups(recs, sig):
    live = []
    for rec in recs:
        if _members(rec):
            try:
                os.killpg(rec["pgid"], sig)
                live.append(rec)
            except ProcessLookupError:
                pass
    return live


def _wait_gone(recs, timeout):
    deadline = time.monotonic() + timeout
    left = list(recs)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [r for r in left if _members(r)]
    return left


def op_stop(req):
    """TERM exactly the recorded groups, KILL what remains after the grace period."""
    recs = req["workers"]
    out = {r["name"]: {"was_running": False} for r in recs}
    for rec in _signal_groups(recs, signal.SIGTERM):
        out[rec["name"]]["was_running"] = True
    left = _wait_gone([r for r in recs if out[r["name"]]["was_running"]], float(req["grace"]))
    for rec in _signal_groups(left, signal.SIGKILL):
        out[rec["name"]]["killed"] = True
    for rec in _wait_gone(left, 5.0):
        out[rec["name"]]["error"] = "processes %s survived SIGKILL" % _members(rec)
    for rec in recs:
        if req.get("lines"):
            out[rec["name"]]["tail"] = _tail(_expand(rec["log"]), int(req["lines"]))
        if "error" not in out[rec["name"]]:
            for suffix in (".json", ".pid.json"):  # the record, and the supervisor's pid file
                try:
                    os.unlink(os.path.join(os.path.dirname(_expand(rec["log"])), rec["name"] + suffix))
                except OSError:
                    pass
    return {"workers": out}


def _read(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def op_find(req):
    """Process groups on this node whose members carry the cluster's marker (for `down` when
    the local state is damaged or gone): one entry per group, identified by its token."""
    groups = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        mark = _marker(int(name))
        st = _stat(int(name))
        if st is None or st[0] == "Z" or mark.get("EPDCTL_CLUSTER") != req["cluster"]:
            continue
        if not mark.get("EPDCTL_TOKEN"):
            continue
        old = groups.get(st[1])
        if old is None or st[2] < old["start_ticks"]:
            groups[st[1]] = {"name": mark.get("EPDCTL_WORKER") or "pid-%s" % name,
                             "pid": int(name), "pgid": st[1], "start_ticks": st[2],
                             "create_time": _create_time(st[2]), "token": mark["EPDCTL_TOKEN"]}
    return {"found": list(groups.values())}


def op_records(req):
    """Every record left in the node's run folder (for `down` when local state is gone)."""
    folder = _expand(req["dir"])
    recs = []
    if os.path.isdir(folder):
        for name in sorted(os.listdir(folder)):
            if name.endswith(".json") and not name.endswith(".pid.json"):
                try:
                    with open(os.path.join(folder, name)) as f:
                        recs.append(json.load(f))
                except (OSError, ValueError):
                    continue
    return {"records": recs}


def op_run(req):
    """Run each command to completion (container runtimes' rm / ps / image inspect, as the
    launcher's records wrote them): status, stdout and stderr each; 127 when not installed."""
    out = []
    for argv in req["commands"]:
        if not shutil.which(argv[0]):
            out.append({"rc": 127, "out": "", "err": "%s: command not found" % argv[0]})
            continue
        try:
            p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=float(req.get("timeout", 60)))
            out.append({"rc": p.returncode, "out": p.stdout.decode(errors="replace"),
                        "err": p.stderr.decode(errors="replace")[-2000:]})
        except (OSError, subprocess.TimeoutExpired) as e:
            out.append({"rc": 124, "out": "", "err": str(e)})
    return {"results": out}


def op_tail(req):
    return {"text": _tail(_expand(req["log"]), int(req.get("lines", 50))),
            "exists": os.path.exists(_expand(req["log"]))}


def _main(req):
    ops = {"prepare": op_prepare, "start": op_start, "poll": op_poll, "stop": op_stop,
           "records": op_records, "tail": op_tail, "find": op_find, "run": op_run}
    try:
        answer = ops[req["op"]](req)
    except Exception as e:  # noqa: the launcher turns this into a [node] error
        answer = {"error": "%s: %s" % (type(e).__name__, e)}
    sys.stdout.write("\n" + MARK + json.dumps(answer) + "\n")
    sys.stdout.flush()


def _serve():
    """One request per stdin line until EOF (the launcher closed the connection)."""
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            return
        if line.strip():
            _main(json.loads(line))


def node_source():
    """The agent as the one stdlib-only script a node runs: ``ssh_agent_procs.py``, then this file
    (its package import and ``__future__`` line dropped: the helpers are already defined)."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "ssh_agent_procs.py")) as f:
        procs = f.read()
    with open(os.path.abspath(__file__)) as f:
        own = f.read().replace("from __future__ import annotations\n", "", 1)
    return procs + "\n" + own
