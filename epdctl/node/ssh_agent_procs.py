"""Process identity on a node, for the ssh agent (``ssh_agent.py``): stdlib only, no epdctl.

A process epdctl started is recognised by its pid, its start time in clock ticks since boot
(the pid-reuse guard), its process group and the ``EPDCTL_TOKEN`` marker in its environment;
records and pid files are written atomically. Kept apart from the agent's operations so each
file holds one idea; the launcher sends both to the node as one script (``ssh_agent.node_source``).
"""

from __future__ import annotations

import json
import os


def _expand(path):
    return os.path.abspath(os.path.expanduser(os.path.expandvars(path)))


def _boot_time():
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return int(line.split()[1])
    return 0


def _stat(pid):
    """(state, pgid, start_ticks) of a live process, or None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[2]), int(fields[19])


def _create_time(ticks):
    return _boot_time() + ticks / os.sysconf("SC_CLK_TCK")


def _ticks(rec):
    """The leader's start time in clock ticks since boot, and how far off it may be.

    Records written on the node carry ``start_ticks`` (exact). Records from the local state
    only carry ``create_time`` = btime + ticks / CLK_TCK, and btime (``/proc/stat``) is whole
    seconds of wall clock minus uptime: it flips by one second when the clock is slewed (NTP),
    so the inverted ticks may be one second (CLK_TCK ticks) off. The token is the proof; the
    start time only rules out a reused pid, which a second of slack does not weaken."""
    if rec.get("start_ticks"):
        return int(rec["start_ticks"]), 0
    hz = os.sysconf("SC_CLK_TCK")
    return int(round((float(rec["create_time"]) - _boot_time()) * hz)), hz + 1


def _marker(pid):
    """The EPDCTL_* identity markers in a process's environment ({} when unreadable)."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        if item.startswith(b"EPDCTL_"):
            k, _, v = item.decode("utf-8", "replace").partition("=")
            out[k] = v
    return out


def _same(rec):
    """True while the recorded leader runs and is the process we started (pid reuse guard)."""
    st = _stat(rec["pid"])
    ticks, slack = _ticks(rec)
    return st is not None and st[0] != "Z" and abs(st[2] - ticks) <= slack and bool(_members(rec))


def _members(rec):
    """Live pids of the recorded group that started no earlier than its leader.

    If the leader's pid now belongs to a process with another start time, the pid (and so
    the group id) was reused: nothing is ours. Linux never hands out a pid that is still some
    group's id, so while the leader is gone, members left in the group are its own children.
    """
    found, (ticks, slack) = [], _ticks(rec)
    if not rec.get("token") or not isinstance(rec.get("pgid"), int) or rec["pgid"] <= 0:
        return []  # no identity recorded: nothing is provably ours
    lead = _stat(rec["pid"])
    if lead is not None and lead[0] != "Z" and abs(lead[2] - ticks) > slack:
        return []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = _stat(int(name))
        if st and st[0] != "Z" and st[1] == rec["pgid"] and st[2] >= ticks - slack:
            found.append(int(name))
    # a forged or stale record: the group must carry the token the record names
    if not any(_marker(p).get("EPDCTL_TOKEN") == rec["token"] for p in found):
        return []
    return found


def _tail(path, n):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            data = f.read()
    except OSError:
        return ""
    lines = data.decode("utf-8", "replace").splitlines()
    return "\n".join(lines[-n:]) if n > 0 else ""


def _write_json(path, doc):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
