"""Type checks of a loaded state: a hand-edited or damaged state.json must give a clear
message (and `down --force`), never a traceback deep inside a launcher."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epdctl.state import ClusterState

_TYPES: dict[str, tuple[type, ...]] = {
    "pid": (int,), "pgid": (int,), "create_time": (int, float), "host": (str, type(None)),
    "job": (str, type(None)), "step": (str, type(None)), "token": (str, type(None))}


def check_state(state: "ClusterState") -> None:
    """ValueError naming the first field of a loaded state with the wrong type."""
    for key in ("name", "launcher", "phase"):
        if not isinstance(getattr(state, key), str):
            raise ValueError(f"{key} is not a string")
    if not isinstance(state.processes, list):
        raise ValueError("processes is not a list")
    for i, rec in enumerate(state.processes):
        for key in ("name", "role", "node", "log"):
            if not isinstance(getattr(rec, key), str):
                raise ValueError(f"processes[{i}].{key} is not a string")
        if not isinstance(rec.argv, list) or not isinstance(rec.env, dict):
            raise ValueError(f"processes[{i}] has a malformed argv or env")
        h = rec.handle
        if h is None:
            continue
        for key, types in _TYPES.items():
            value = getattr(h, key)
            if not isinstance(value, types) or isinstance(value, bool):
                raise ValueError(f"processes[{i}].handle.{key} is {type(value).__name__}")
        if h.pid < 0 or h.pgid < 0:
            raise ValueError(f"processes[{i}].handle has a negative pid")
