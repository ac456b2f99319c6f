"""Copies model weights from shared storage to this node's own disk, checked by a manifest.

Run on a node as ``python -m epdctl.node.stage_agent`` with one JSON request on stdin::

    {"op": "space" | "copy", "origin": "/shared/...", "dest": "/local/nvme/...",
     "files": [["model.safetensors", SIZE, "SHA256"], ...], "threads": N}

``space`` answers one line: the free bytes of the filesystem that holds ``dest``, the bytes the
copy still needs there (files absent or of another size), origin files this node cannot read,
and whether ``dest`` can be written. ``copy`` checks every file already in ``dest`` against its
size and SHA-256, copies (or re-copies) each that differs while hashing it, and prints JSON
lines as it goes (``progress`` with bytes done and to do, then ``done`` or ``error``); the
manifest itself is written last as ``dest/.epdctl-manifest.json``.

Standard library only: it runs with the node's bare Python.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

MANIFEST_NAME = ".epdctl-manifest.json"
CHUNK = 8 << 20
EVERY = 0.25  # seconds between progress lines
# Files are hashed and copied this many at a time: SHA-256 releases the GIL, so a node with many
# cores verifies and copies several shards at once instead of one core's hash rate.
THREADS = max(1, min(8, os.cpu_count() or 1))


def say(**doc: Any) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def existing_parent(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def space(req: dict[str, Any]) -> int:
    dest, origin = req["dest"], req["origin"]
    need = 0
    unreadable = []
    for rel, size, _ in req["files"]:
        try:
            if os.stat(os.path.join(dest, rel)).st_size == size:
                continue
        except OSError:
            pass
        need += size
        src = os.path.join(origin, rel)
        if not os.access(src, os.R_OK):
            unreadable.append(rel)
    where = existing_parent(dest)
    st = os.statvfs(where)
    say(ev="space", free=st.f_bavail * st.f_frsize, need=need, unreadable=unreadable[:5],
        unreadable_count=len(unreadable), writable=os.access(where, os.W_OK | os.X_OK), at=where)
    return 0


class Progress:
    def __init__(self, total: int):
        self.total, self.done, self.last = total, 0, 0.0
        self.lock = threading.Lock()

    def add(self, phase: str, n: int) -> None:
        with self.lock:
            self.done += n
            now = time.monotonic()
            if now - self.last >= EVERY:
                self.last = now
                say(ev="progress", phase=phase, done=self.done, total=self.total)


def each(fn: Callable[..., Any], items: list[Any], threads: int = THREADS) -> list[Any]:
    """``fn(*item)`` for every item, ``threads`` at a time, results in order."""
    if threads <= 1 or len(items) < 2:
        return [fn(*item) for item in items]
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda item: fn(*item), items))


def sha256_of(path: str, progress: Progress, phase: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            progress.add(phase, len(chunk))
    return h.hexdigest()


def copy_one(src: str, dst: str, progress: Progress) -> str:
    """Copy ``src`` to ``dst`` (through ``dst.part``, renamed at the end); the copy's SHA-256."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    part = dst + ".part"
    h = hashlib.sha256()
    with open(src, "rb") as fi, open(part, "wb") as fo:
        while chunk := fi.read(CHUNK):
            fo.write(chunk)
            h.update(chunk)
            progress.add("copy", len(chunk))
        fo.flush()
        os.fsync(fo.fileno())
    os.replace(part, dst)
    return h.hexdigest()


def copy(req: dict[str, Any]) -> int:
    dest, origin, files = req["dest"], req["origin"], req["files"]
    threads = int(req.get("threads") or THREADS)
    present = []
    for rel, size, sha in files:
        try:
            if os.stat(os.path.join(dest, rel)).st_size == size:
                present.append((rel, size, sha))
        except OSError:
            pass
    verify = Progress(sum(s for _, s, _ in present))
    sums = each(sha256_of, [(os.path.join(dest, rel), verify, "verify") for rel, _, _ in present], threads)
    good = {rel for (rel, _, sha), got in zip(present, sums) if got == sha}
    todo = [(rel, size, sha) for rel, size, sha in files if rel not in good]
    differed = [rel for rel, _, _ in present if rel not in good]
    progress = Progress(sum(s for _, s, _ in todo))
    say(ev="progress", phase="copy", done=0, total=progress.total)
    copies = each(copy_one, [(os.path.join(origin, rel), os.path.join(dest, rel), progress) for rel, _, _ in todo], threads)
    for (rel, _, sha), got in zip(todo, copies):
        if got != sha:
            say(ev="error", file=rel, why=f"the copy of {rel} has SHA-256 {got[:12]}..., the manifest says "
                                          f"{sha[:12]}...: the origin changed since the manifest was written")
            return 2
    with open(os.path.join(dest, MANIFEST_NAME), "w") as f:
        json.dump({"origin": origin, "files": files}, f)
    say(ev="progress", phase="copy", done=progress.total, total=progress.total)
    say(ev="done", copied=[r for r, _, _ in todo if r not in differed], recopied=differed, kept=len(good),
        bytes=progress.total)
    return 0


def main() -> int:
    try:
        req = json.loads(sys.stdin.read())
        return {"space": space, "copy": copy}[req["op"]](req)
    except OSError as e:
        say(ev="error", file=getattr(e, "filename", None) or "", why=f"{e.strerror or e}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
