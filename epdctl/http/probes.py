"""HTTP probes of workers: health, `/v1/loads`, `/server_info` (stdlib only).

Each probe returns a value describing what it saw (never raises for a dead or slow worker):
`status` must render a table even when half the cluster is down.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from http.client import HTTPException
from dataclasses import dataclass
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class HttpReply:
    """Status and body of one HTTP exchange; status 0 means no answer (error says why)."""

    status: int
    body: bytes = b""
    error: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        """The body as JSON, or None if it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None


def http(method: str, url: str, body: Any = None, *, timeout: float = 3.0,
         headers: Mapping[str, str] | None = None) -> HttpReply:
    """One request; HTTP errors come back as a reply, network errors as status 0."""
    data = None if body is None else json.dumps(body).encode()
    hdrs = {"Accept": "application/json", **(headers or {})}
    if data is not None:
        hdrs["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return HttpReply(r.status, r.read(), seconds=time.monotonic() - t0)
    except urllib.error.HTTPError as e:
        return HttpReply(e.code, e.read() or b"", error=f"HTTP {e.code}",
                         seconds=time.monotonic() - t0)
    except (urllib.error.URLError, OSError, socket.timeout, HTTPException) as e:
        # HTTPException: something that is not an HTTP server answered (e.g. a probe that
        # connected to itself through an ephemeral port), which is "not healthy", not a crash.
        reason = getattr(e, "reason", e)
        return HttpReply(0, error=str(reason) or type(e).__name__,
                         seconds=time.monotonic() - t0)


@dataclass(frozen=True)
class Health:
    """Result of one health probe."""

    ok: bool
    detail: str   # "ok", "HTTP 503", "connection refused", ...
    seconds: float


def probe_health(base_url: str, path: str = "/health", timeout: float = 2.0) -> Health:
    """GET the worker's health endpoint."""
    r = http("GET", base_url.rstrip("/") + path, timeout=timeout)
    if r.ok:
        return Health(True, "ok", r.seconds)
    return Health(False, r.error or f"HTTP {r.status}", r.seconds)


@dataclass(frozen=True)
class Load:
    """Summary of `/v1/loads` (SGLang shape, summed over dp ranks)."""

    running: int
    waiting: int
    token_usage: float | None


def parse_loads(doc: Any) -> Load | None:
    """Sum SGLang's ``{"loads": [{"num_running_reqs", "num_waiting_reqs", ...}]}``."""
    if not isinstance(doc, dict) or not isinstance(doc.get("loads"), list):
        return None
    running = waiting = 0
    usage: list[float] = []
    for entry in doc["loads"]:
        if not isinstance(entry, dict):
            continue
        running += int(entry.get("num_running_reqs") or 0)
        waiting += int(entry.get("num_waiting_reqs") or 0)
        if isinstance(entry.get("token_usage"), (int, float)):
            usage.append(float(entry["token_usage"]))
    return Load(running, waiting, max(usage) if usage else None)


def get_loads(base_url: str, timeout: float = 2.0) -> Load | None:
    """The worker's load, or None if it does not serve `/v1/loads` or is down."""
    r = http("GET", base_url.rstrip("/") + "/v1/loads", timeout=timeout)
    return parse_loads(r.json()) if r.ok else None


def server_info(base_url: str, timeout: float = 3.0) -> dict[str, Any] | None:
    """`/server_info` as a dict, or None."""
    r = http("GET", base_url.rstrip("/") + "/server_info", timeout=timeout)
    doc = r.json() if r.ok else None
    return doc if isinstance(doc, dict) else None


def wait_for(check: Callable[[], bool], timeout: float, interval: float = 0.5,
             on_tick: Callable[[float], None] | None = None) -> bool:
    """Poll ``check`` until it is true or ``timeout`` passes; ``on_tick(elapsed)`` each round.

    ``check`` may raise to abort the wait (e.g. the worker died).
    """
    t0 = time.monotonic()
    while True:
        if check():
            return True
        elapsed = time.monotonic() - t0
        if elapsed >= timeout:
            return False
        if on_tick is not None:
            on_tick(elapsed)
        time.sleep(interval)
