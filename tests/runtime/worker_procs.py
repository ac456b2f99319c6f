"""Real worker processes for the server tests: ``python -m epdctl.runtime <role> ...``.

Each worker logs to a file; a worker that dies while we wait for it fails the test with the
tail of its log. Stopping uses SIGTERM (the graceful path under test) and only then SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parents[2]
COMMITTED_MODEL = ROOT / "models" / "tiny-qwen2vl"


def pick_model(tmp: Path, fallback: Path) -> Path:
    """A snapshot of the committed model once it is trained (so a training run writing it cannot change
    the weights under the workers), else the tiny random checkpoint."""
    report = COMMITTED_MODEL / "training_report.json"
    try:
        trained = json.loads(report.read_text()).get("steps", 0) > 0
    except (OSError, ValueError):
        trained = False
    if not trained:
        return fallback
    dest = tmp / "tiny-qwen2vl"
    shutil.copytree(COMMITTED_MODEL, dest)
    return dest


class Worker:
    def __init__(self, role: str, args: list[str], log_dir: Path, name: str | None = None):
        self.role = role
        self.name = name or role
        self.port = int(args[args.index("--port") + 1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{self.name}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "epdctl.runtime", role, "--host", "127.0.0.1", *args],
                                     stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT)

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def wait_ready(self, timeout: float = 300.0) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} not healthy after {timeout:.0f} s:\n{self.log_tail()}")

    def rss(self) -> int:
        return psutil.Process(self.proc.pid).memory_info().rss

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


def start_all(workers: list[Worker]) -> None:
    try:
        for w in workers:
            w.wait_ready()
    except BaseException:
        for w in workers:
            w.kill()
        raise


def chat_body(model: str, images: list[str], text: str = "describe the image", **extra: Any) -> dict:
    content: list[dict] = [{"type": "image_url", "image_url": {"url": u}} for u in images]
    content.append({"type": "text", "text": text})
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


def with_room(body: dict, bootstrap_port: int) -> dict:
    return {**body, "bootstrap_host": "127.0.0.1", "bootstrap_port": bootstrap_port,
            "bootstrap_room": random.getrandbits(63)}


async def post(session: aiohttp.ClientSession, url: str, body: Any, raw: bool = False) -> tuple[int, str]:
    kwargs = {"data": body, "headers": {"Content-Type": "application/json"}} if raw else {"json": body}
    async with session.post(url, **kwargs) as resp:
        return resp.status, await resp.text()


async def pd_call(prefill: str, decode: str, body: dict) -> tuple[tuple[int, str], tuple[int, str]]:
    """What smg does: the same body to prefill and decode, concurrently; the client gets decode's answer."""
    async with aiohttp.ClientSession() as s:
        p, d = await asyncio.gather(post(s, prefill + "/v1/chat/completions", body),
                                    post(s, decode + "/v1/chat/completions", body))
    return p, d


def sse_events(text: str) -> list[Any]:
    """Parse an SSE body into JSON events; the last one is the string "[DONE]"."""
    events: list[Any] = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def metric(text: str, name: str) -> float:
    """Sum of every sample of ``name`` (any labels) in Prometheus text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total
