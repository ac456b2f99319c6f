"""Admin client for the smg router: readiness, `GET/POST/DELETE /workers`, launch flags.

The API key (if the topology names an env var for it) is read from the environment at call
time and sent as a Bearer header; it is never logged, stored or put into an error message.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from epdctl.errors import LaunchError, ProbeError
from epdctl.http.probes import HttpReply, http
from epdctl.render.router import HEALTH_FLAGS

log = logging.getLogger(__name__)

# Fast health checks (a dead worker out of rotation within seconds, not smg's 60 s x 3): the
# flags every rendered router carries; here for routers that tests and benchmarks start by hand.
LOCAL_HEALTH_FLAGS: dict[str, str] = HEALTH_FLAGS


def with_local_health_flags(argv: tuple[str, ...] | list[str]) -> list[str]:
    """Append fast health-check flags unless the plan already chose values."""
    out = list(argv)
    for flag, value in LOCAL_HEALTH_FLAGS.items():
        if flag not in out:
            out += [flag, value]
    return out


@dataclass(frozen=True)
class RouterWorker:
    """One worker as the router sees it."""

    id: str
    url: str
    worker_type: str
    healthy: bool
    status: str
    load: Any


class RouterClient:
    """Talks to one smg router's HTTP API."""

    def __init__(self, url: str, api_key_env: str | None = None, timeout: float = 5.0):
        self.url = url.rstrip("/")
        self.api_key_env = api_key_env
        self.timeout = timeout

    def _headers(self) -> dict[str, str]:
        if not self.api_key_env:
            return {}
        key = os.environ.get(self.api_key_env)
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _call(self, method: str, path: str, body: Any = None) -> HttpReply:
        return http(method, self.url + path, body, timeout=self.timeout, headers=self._headers())

    def _json(self, method: str, path: str, body: Any = None) -> Any:
        r = self._call(method, path, body)
        if r.status == 0:
            raise ProbeError(f"router {self.url} unreachable ({r.error}); is it running? "
                             "(see `epdctl status` / `epdctl logs router`)")
        if r.status in (401, 403):
            hint = (f"check ${self.api_key_env}" if self.api_key_env
                    else "the router wants an API key; name its env var in the topology")
            raise ProbeError(f"router {self.url} refused {method} {path} (HTTP {r.status}); "
                             f"{hint}")
        if not r.ok:
            raise ProbeError(f"router {self.url}: {method} {path} -> HTTP {r.status}: "
                             f"{r.body[:300].decode(errors='replace')}")
        return r.json()

    def alive(self) -> bool:
        """True when the router answers `/health`."""
        return self._call("GET", "/health").ok

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """(ready, body) from `/readiness`; a 503 'not ready' is a normal answer here."""
        r = self._call("GET", "/readiness")
        doc = r.json()
        if r.status == 0:
            return False, {"status": "unreachable", "reason": r.error}
        return r.ok, doc if isinstance(doc, dict) else {"status": f"HTTP {r.status}"}

    def workers(self) -> list[RouterWorker]:
        """`GET /workers` as records."""
        doc = self._json("GET", "/workers")
        out = []
        for w in (doc or {}).get("workers", []):
            out.append(RouterWorker(
                id=str(w.get("id", "")), url=str(w.get("url", "")).rstrip("/"),
                worker_type=str(w.get("worker_type", "")), healthy=bool(w.get("is_healthy")),
                status=str(w.get("status", "")), load=w.get("load"),
            ))
        return out

    def add_worker(self, url: str, worker_type: str, *, bootstrap_port: int | None = None,
                   model: str | None = None) -> str:
        """Register a prefill/decode worker through `POST /workers`; returns its id."""
        spec: dict[str, Any] = {"url": url, "worker_type": worker_type, "runtime_type": "sglang"}
        if bootstrap_port is not None:
            spec["bootstrap_port"] = bootstrap_port
        if model:
            spec["models"] = [{"id": model}]
        doc = self._json("POST", "/workers", spec)
        wid = (doc or {}).get("worker_id")
        if not wid:
            raise LaunchError(f"router {self.url} accepted {url} but returned no worker id")
        return str(wid)

    def set_drain_settle(self, worker_id: str, seconds: float) -> bool:
        """smg ``PATCH /workers/{id} {"health": {"drain_settle_secs": N}}``: how long a removal
        waits before the worker leaves the router. False when the router has no such API."""
        return self._call("PATCH", f"/workers/{worker_id}",
                          {"health": {"drain_settle_secs": int(seconds)}}).ok

    def remove_worker(self, worker_id: str) -> None:
        """`DELETE /workers/{id}` (asynchronous on smg's side)."""
        self._json("DELETE", f"/workers/{worker_id}")

    def find(self, url: str) -> RouterWorker | None:
        """The router's record for a worker URL, if registered."""
        url = url.rstrip("/")
        return next((w for w in self.workers() if w.url == url), None)

    def wait_ready(self, timeout: float, interval: float = 0.5) -> dict[str, Any]:
        """Poll `/readiness` until ready; ProbeError with the last answer on timeout."""
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            ok, last = self.readiness()
            if ok:
                return last
            time.sleep(interval)
        raise ProbeError(f"router {self.url} not ready after {timeout:.0f}s: {last}")
