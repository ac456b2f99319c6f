"""Copy the weights to every node's own disk at once, each node checked against the manifest.

Two rounds over all nodes in parallel. First every node says how much room its stage folder
has and how much the copy needs; a node without room (or one that cannot read the origin or
write the folder) refuses the whole stage before any byte is copied, and every such node is
named. Then every node verifies what it already holds, copies (or re-copies) what differs, and
reports bytes as it goes (``epdctl/node/stage_agent.py`` does the work on the node).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Mapping

from epdctl.errors import EpdctlError, StageError
from epdctl.launchers.streams import NodeJobs
from epdctl.stage.events import NodeProgress, NodeStaged, SpaceChecked
from epdctl.stage.manifest import Manifest

AGENT = ("-m", "epdctl.node.stage_agent")


def _request(op: str, manifest: Manifest, dest: str, threads: int | None = None) -> bytes:
    return json.dumps({"op": op, "origin": manifest.origin, "dest": dest, "threads": threads,
                       "files": [list(f) for f in manifest.files]}).encode()


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _space_one(job: NodeJobs, req: bytes) -> dict[str, Any]:
    stream = job.start([job.python, *AGENT], req)
    docs = [json.loads(line) for line in stream.lines() if line.startswith("{")]
    rc, err = stream.finish()
    answer = next((d for d in docs if d.get("ev") == "space"), None)
    if rc != 0 or answer is None:
        why = next((d.get("why") for d in docs if d.get("ev") == "error"), None) or err.strip().splitlines()[-1:]
        raise StageError(f"the stage agent failed (exit {rc}): {why or 'no output'}")
    return answer


def check_space(jobs: Mapping[str, NodeJobs], manifest: Manifest, dest: str) -> Iterator[SpaceChecked]:
    """Every node's free room against what its copy needs; StageError naming every node that
    cannot take the copy (full, unwritable, origin unreadable, unreachable), before any copy."""
    req = _request("space", manifest, dest)
    answers: dict[str, dict[str, Any] | Exception] = {}

    def one(node: str) -> None:
        try:
            answers[node] = _space_one(jobs[node], req)
        except (EpdctlError, OSError, ValueError) as e:
            answers[node] = e

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(jobs)))) as pool:
        list(pool.map(one, jobs))
    refused = []
    for node in jobs:
        a = answers[node]
        if isinstance(a, Exception):
            refused.append(f"[{node}] cannot check: {a}")
            continue
        if not a["writable"]:
            refused.append(f"[{node}] cannot write {a['at']} (the stage folder {dest} or its parent): fix the "
                           f"permissions or choose another model.stage")
        elif a["need"] > a["free"]:
            refused.append(f"[{node}] not enough room in {dest}: the copy needs {_gib(a['need'])}, the "
                           f"filesystem at {a['at']} has {_gib(a['free'])} free; free space there or choose "
                           f"another model.stage")
        if a["unreadable_count"]:
            refused.append(f"[{node}] cannot read {a['unreadable_count']} file(s) of {manifest.origin} (e.g. "
                           f"{a['unreadable'][0]}): the weights must be on storage this node mounts")
        yield SpaceChecked(node, int(a["free"]), int(a["need"]))
    if refused:
        raise StageError(f"staging refused before copying anything: {len(refused)} problem(s) on "
                         f"{len({r.split(']')[0] for r in refused})} of {len(jobs)} node(s):\n  " + "\n  ".join(refused))


def copy(jobs: Mapping[str, NodeJobs], manifest: Manifest, dest: str,
         threads: int | None = None) -> Iterator[NodeProgress | NodeStaged]:
    """All nodes copy at once; their progress as it comes; StageError naming every node that
    failed once all have finished (the others' copies stand). ``threads``: files each node
    hashes and copies at once (default: its CPUs, at most 8)."""
    req = _request("copy", manifest, dest, threads)
    inbox: queue.Queue[tuple[str, dict[str, Any] | None, Exception | None]] = queue.Queue()

    def one(node: str) -> None:
        try:
            job = jobs[node]
            stream = job.start([job.python, *AGENT], req)
            last: dict[str, Any] | None = None
            for line in stream.lines():
                if line.startswith("{"):
                    last = json.loads(line)
                    inbox.put((node, last, None))
            rc, err = stream.finish()
            if rc != 0 and (last is None or last.get("ev") != "error"):
                tail = err.strip().splitlines()[-1:] or ["no output"]
                raise StageError(f"the stage agent exited with status {rc}: {tail[0]}")
            inbox.put((node, None, None))
        except (EpdctlError, OSError, ValueError) as e:
            inbox.put((node, None, e))

    workers = [threading.Thread(target=one, args=(n,), name=f"epdctl-stage-{n}", daemon=True) for n in jobs]
    started = {n: time.monotonic() for n in jobs}
    phase_t0: dict[tuple[str, str], float] = {}
    failed: dict[str, str] = {}
    for t in workers:
        t.start()
    left = set(jobs)
    while left:
        node, doc, exc = inbox.get()
        if doc is None:
            left.discard(node)
            if exc is not None:
                failed[node] = str(exc)
            continue
        ev = doc.get("ev")
        if ev == "progress":
            t0 = phase_t0.setdefault((node, doc["phase"]), time.monotonic())
            took = time.monotonic() - t0
            yield NodeProgress(node, doc["phase"], int(doc["done"]), int(doc["total"]),
                               doc["done"] / took if took > 0 else 0.0)
        elif ev == "error":
            failed[node] = f"{doc.get('file') or dest}: {doc.get('why')}"
        elif ev == "done":
            yield NodeStaged(node, tuple(doc["copied"]), tuple(doc["recopied"]), int(doc["kept"]),
                             int(doc["bytes"]), time.monotonic() - started[node])
    for t in workers:
        t.join()
    if failed:
        fine = [n for n in jobs if n not in failed]
        raise StageError(f"staging failed on {len(failed)} of {len(jobs)} node(s):\n  "
                         + "\n  ".join(f"[{n}] {why}" for n, why in failed.items())
                         + (f"\nstaged and verified: {', '.join(fine)}" if fine else ""))
