"""Type checks of a decoded state.json before it becomes records: a hand-edited or damaged file
must give a clear message (and `down --force`), never a traceback deep inside a launcher."""

from __future__ import annotations

from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "pid": (int,), "pgid": (int,), "create_time": (int, float), "host": (str, type(None)),
    "job": (str, type(None)), "step": (str, type(None)), "token": (str, type(None))}


def check_state(data: dict[str, Any]) -> None:
    """ValueError naming the first field of a decoded state with the wrong type. A field that is
    absent takes the record's default; a process that is not an object is left to the record's
    own reader, which says so."""
    for key in ("name", "launcher", "phase"):
        if key in data and not isinstance(data[key], str):
            raise ValueError(f"{key} is not a string")
    procs = data.get("processes", [])
    if not isinstance(procs, list):
        raise ValueError("processes is not a list")
    for i, rec in enumerate(procs):
        if not isinstance(rec, dict):
            continue
        for key in ("name", "role", "node", "log"):
            if key in rec and not isinstance(rec[key], str):
                raise ValueError(f"processes[{i}].{key} is not a string")
        if not isinstance(rec.get("argv", []), list) or not isinstance(rec.get("env", {}), dict):
            raise ValueError(f"processes[{i}] has a malformed argv or env")
        h = rec.get("handle")
        if h is None:
            continue
        if not isinstance(h, dict):
            raise ValueError(f"processes[{i}].handle is not an object")
        for key, types in _TYPES.items():
            value = h.get(key)
            if key in h and (not isinstance(value, types) or isinstance(value, bool)):
                raise ValueError(f"processes[{i}].handle.{key} is {type(value).__name__}")
        if h.get("pid", 0) < 0 or h.get("pgid", 0) < 0:
            raise ValueError(f"processes[{i}].handle has a negative pid")
