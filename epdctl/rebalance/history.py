"""Append-only rebalance history (``history.jsonl`` next to ``state.json``).

Why a separate file: ``state.json`` says what runs now; the history says who changed what, when,
and how it went (per-step durations), and its successful moves *are* the applied role map: the
current layout is the topology file with those moves replayed (a versioned, auditable layout).
Appends take an exclusive flock on the file so two writers never interleave a line.
"""

from __future__ import annotations

import fcntl
import getpass
import json
import os
import socket
from pathlib import Path
from typing import Any

from epdctl.errors import StateError
from epdctl.rebalance.plan import Move

FILE = "history.jsonl"


def history_path(cluster_root: Path) -> Path:
    return cluster_root / FILE


def who() -> str:
    """user@host of the operator (the audit trail's 'who')."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def append(cluster_root: Path, record: dict[str, Any]) -> None:
    """Append one JSON line under an exclusive lock, fsynced."""
    cluster_root.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, sort_keys=True) + "\n"
    with open(history_path(cluster_root), "a", encoding="utf-8") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def read(cluster_root: Path) -> list[dict[str, Any]]:
    """Every record, oldest first; StateError naming the bad line if one is corrupt."""
    path = history_path(cluster_root)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise StateError(f"{path}:{n}: corrupt history line ({e}); fix or remove it") from e
        if isinstance(rec, dict):
            out.append(rec)
    return out


def applied_moves(records: list[dict[str, Any]], since: float = 0.0) -> list[Move]:
    """Moves that took effect (outcome ``done``) in records newer than ``since`` (the `up`)."""
    moves = []
    for rec in records:
        if float(rec.get("started", 0)) < since:
            continue
        for m in rec.get("moves", []):
            if m.get("outcome") == "done":
                moves.append(Move.from_dict(m["move"]))
    return moves
