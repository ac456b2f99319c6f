"""Recovery after ``kill -9`` of a worker, on an idle host and on a host kept busy by other work.

Starts a copy of topologies/local.yaml (2 E / 1 P / 1 D + smg, ports 31700-31799, state in a temp
dir) with `epdctl up`. A client thread asks a fixed set of image questions back to back through
the router (openai client, greedy); the answers given before any kill are the right ones. Then,
per role, the worker process itself (not its supervisor) is killed with SIGKILL and the time
until answers are right again is measured, split where it goes:

- back-off: kill -> the supervisor started the new process, or handed over to the worker's warm
              spare (its pid file names a new child); each kill waits for the spare to be
              ready (``standby_ready`` in the pid file: steady state);
- load:     -> the new process answers its health check (the supervisor's pid file says running:
              interpreter start, imports, model load);
- serve:    -> the first request started after that whose answer is right (the router's health
              probe and circuit breaker, the prefill's encoder registry, the KV links);
- total:    kill -> the first request started after the kill whose answer is right.

"loaded": ``--burners`` processes (default: one per CPU) spin on the CPU at normal priority the
whole time, as other work on a shared host does. The cluster is started afresh for each
condition, so every kill meets a worker in its first run (back-off not yet doubled). Measured,
not asserted; writes benchmarks/results/recovery.json.

    flock /tmp/epd-heavy.lock timeout 900 nice -n 10 .venv/bin/python benchmarks/bench_recovery.py
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from epdctl import shapes  # noqa: E402

BASE = 31700
NAME = "bench-recovery"
QUESTIONS = 4


def _burn() -> None:
    while True:
        pass


class Client:
    """One thread asking QUESTIONS fixed requests in turn; (start, end, index, answer or None)."""

    def __init__(self, url: str):
        import openai

        self.api = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        self.requests = [shapes.make_request(random.Random(i), 1, plain=True) for i in range(QUESTIONS)]
        self.right: dict[int, str] = {}
        self.log: list[tuple[float, float, int, str | None]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def ask(self, i: int) -> str | None:
        pngs, question, _ = self.requests[i]
        parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {
            "url": "data:image/png;base64," + base64.b64encode(p).decode()}} for p in pngs]
        parts.append({"type": "text", "text": question})
        try:
            messages: Any = [{"role": "user", "content": parts}]
            r = self.api.chat.completions.create(model="tiny-qwen2vl", max_tokens=8, temperature=0,
                                                 messages=messages)
            return r.choices[0].message.content or ""
        except Exception:  # noqa: BLE001 - a failed request is an outcome
            return None

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            i = n % QUESTIONS
            t0 = time.monotonic()
            answer = self.ask(i)
            self.log.append((t0, time.monotonic(), i, answer))
            if answer is None:
                time.sleep(0.1)
            n += 1

    def first_right_after(self, t: float) -> float | None:
        return next((s for s, _, i, a in list(self.log) if s > t and a == self.right[i]), None)


class Cluster:
    def __init__(self, tmp: Path, standby: bool):
        tmp.mkdir(parents=True, exist_ok=True)
        doc = yaml.safe_load((ROOT / "topologies" / "local.yaml").read_text())
        doc["name"] = NAME
        doc["model"]["path"] = str((ROOT / "models" / "tiny-qwen2vl").resolve())
        doc["ports"] = {"base": BASE, "limit": BASE + 99}
        if not standby:
            doc["restart"] = {"standby": False}
        self.topology = tmp / f"{NAME}.yaml"
        self.topology.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.state = tmp / "state"
        self.env = dict(os.environ, EPDCTL_STATE_DIR=str(self.state))

    def epdctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "epdctl", *args], env=self.env, cwd=ROOT, text=True,
                              capture_output=True, timeout=900)

    def pid_doc(self, worker: str) -> dict[str, Any]:
        try:
            return json.loads((self.state / "clusters" / NAME / "run" / f"{worker}.pid.json").read_text())
        except (OSError, ValueError):
            return {}

    def router(self) -> str:
        st = json.loads((self.state / "clusters" / NAME / "state.json").read_text())
        return next(p["url"] for p in st["processes"] if p["role"] == "router")


def kill_one(c: Cluster, client: Client, worker: str, deadline_s: float, standby: bool) -> dict[str, Any]:
    """Kill ``worker`` in steady state: running, and (standby on) its spare's imports done."""
    before = c.pid_doc(worker)
    end = time.monotonic() + 180
    while time.monotonic() < end and not (
            before.get("state") == "running" and (before.get("standby_ready") or not standby)):
        time.sleep(0.2)
        before = c.pid_doc(worker)
    t_kill = time.monotonic()
    os.kill(int(before["child_pid"]), signal.SIGKILL)
    end = t_kill + deadline_s
    t_spawn = t_up = t_right = None
    while time.monotonic() < end and t_right is None:
        now = c.pid_doc(worker)
        if t_spawn is None and now.get("child_pid") not in (None, before["child_pid"]):
            t_spawn = time.monotonic()
        if t_spawn is not None and t_up is None and now.get("state") == "running":
            t_up = time.monotonic()
        if t_up is not None:
            t_right = client.first_right_after(t_kill)
        time.sleep(0.05)
    between = [a for s, _, _, a in client.log if s > t_kill and (t_right is None or s < t_right)]
    r = lambda x: None if x is None else round(x, 2)  # noqa: E731
    return {"worker": worker, "spare_ready": bool(before.get("standby_ready")), "backoff_s": r(t_spawn and t_spawn - t_kill),
            "load_s": r(t_up and t_spawn and t_up - t_spawn),
            "serve_s": r(t_right and t_up and max(0.0, t_right - t_up)),
            "total_s": r(t_right and t_right - t_kill),
            "failed_between": sum(a is None for a in between),
            "wrong_between": sum(a is not None for a in between)}


def condition(tmp: Path, workers: list[str], burners: int, deadline_s: float,
              standby: bool) -> list[dict[str, Any]]:
    c = Cluster(tmp, standby)
    up = c.epdctl("up", str(c.topology), "--timeout", "600", "--no-canary")
    if up.returncode != 0:
        sys.exit(f"up failed:\n{up.stdout}\n{up.stderr}")
    procs: list[multiprocessing.Process] = []
    client = Client(c.router())
    try:
        for i in range(QUESTIONS):          # the right answers: asked before any kill or burner
            answer = client.ask(i)
            if answer is None:
                sys.exit(f"question {i} failed before any kill")
            client.right[i] = answer
        procs = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(burners)]
        for p in procs:
            p.start()
        client.thread.start()
        time.sleep(3)
        out = []
        for w in workers:
            row = kill_one(c, client, w, deadline_s, standby)
            print(json.dumps({"burners": burners, **row}), flush=True)
            out.append(row)
            time.sleep(3)
        return out
    finally:
        client.stop.set()
        for p in procs:
            p.kill()
        client.thread.join(90)
        c.epdctl("down", NAME)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="prefill-0,decode-0,encoder-0")
    ap.add_argument("--burners", type=int, default=os.cpu_count() or 2,
                    help="CPU-spinning processes on the loaded host (default: one per CPU)")
    ap.add_argument("--deadline", type=float, default=120.0, help="seconds one recovery may take")
    ap.add_argument("--no-standby", action="store_true",
                    help="restart: {standby: false}: every restart starts cold (for comparison)")
    ap.add_argument("--out", type=Path, default=None,
                    help="default benchmarks/results/recovery.json (recovery-no-standby.json)")
    args = ap.parse_args()
    args.out = args.out or ROOT / "benchmarks" / "results" / (
        "recovery-no-standby.json" if args.no_standby else "recovery.json")
    workers = args.workers.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    standby = not args.no_standby
    idle = condition(tmp / "idle", workers, 0, args.deadline, standby)
    loaded = condition(tmp / "loaded", workers, args.burners, args.deadline, standby)
    cols = ("backoff_s", "load_s", "serve_s", "total_s", "failed_between")
    print(f"\nseconds from kill -9 until answers are right again (idle | {args.burners} CPU burners; "
          f"standby {'on' if standby else 'off'})")
    print(f"{'worker':<11}" + "".join(f"{c:>16}" for c in cols))
    for a, b in zip(idle, loaded):
        print(f"{a['worker']:<11}" + "".join(f"{str(a[c]):>7} | {str(b[c]):<6}" for c in cols))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"burners": args.burners, "standby": standby, "idle": idle, "loaded": loaded}, indent=2) + "\n")


if __name__ == "__main__":
    main()
