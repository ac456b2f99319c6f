"""Per-role control points of a live move: take a worker out of rotation, drain it, put it back.

prefill/decode (and encoders an engine's router calls itself, ``Engine.routed_encoders``: vLLM
behind epdctl-epd): the router (``DELETE /workers/{id}``, asynchronous: wait until it is gone from
``GET /workers``), then in-flight work to zero, read where the engine says
(``Engine.idle_gauges``: vLLM's own ``/metrics`` gauges; else ``/v1/loads``); SGLang workers are
also paused (``POST /pause_generation``) so nothing new starts before the stop.
other encoders: unregistered from every prefill's encoder registry (SGLang's EncoderBootstrapServer
API); such an encoder is idle once its queue is empty and its request counter stops moving.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

from epdctl.engines.base import Engine
from epdctl.http import metrics
from epdctl.errors import ProbeError
from epdctl.http.probes import get_loads, http
from epdctl.http.routerctl import RouterClient

log = logging.getLogger(__name__)


class DrainError(ProbeError):
    """A worker could not be taken out of rotation or did not go idle in time."""


def _poll(check: Callable[[], bool], timeout: float, interval: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


# -- router (prefill / decode) ---------------------------------------------------------------

def router_remove(client: RouterClient, url: str, timeout: float = 30.0, fast: bool = True) -> bool:
    """Remove ``url`` from the router and wait until it is no longer listed.

    ``fast``: first set the worker's removal settle to 0 (smg ``PATCH /workers/{id}``): smg
    stops routing to a worker at once on ``DELETE`` (status ``draining``) and otherwise keeps it
    listed for its 5 s settle; epdctl waits for the worker's own in-flight requests instead
    (``wait_loads_idle``). Returns False when it was not registered (nothing to do)."""
    rec = client.find(url)
    if rec is None:
        return False
    if fast and not client.set_drain_settle(rec.id, 0):
        log.info("router %s has no PATCH /workers: waiting for its own removal settle", client.url)
    client.remove_worker(rec.id)
    if not _poll(lambda: client.find(url) is None, timeout):
        raise DrainError(f"router {client.url} still lists {url} {timeout:.0f}s after "
                         f"DELETE /workers/{rec.id}; see `epdctl logs router`")
    return True


def router_add(client: RouterClient, url: str, worker_type: str, *, bootstrap_port: int | None,
               model: str | None, timeout: float = 60.0) -> str:
    """Register through ``POST /workers`` and wait until the router calls it healthy."""
    wid = client.add_worker(url, worker_type, bootstrap_port=bootstrap_port, model=model)

    def ready() -> bool:
        rec = client.find(url)
        return rec is not None and rec.healthy
    if not _poll(ready, timeout):
        raise DrainError(f"router {client.url} accepted {url} as {worker_type} (id {wid}) but "
                         f"it is not healthy after {timeout:.0f}s; see `epdctl logs router`")
    return wid


# -- encoder registries (on every prefill) ---------------------------------------------------

def registry_auth(api_key_env: str | None) -> dict[str, str]:
    """The cluster's API key for the embedded runtime's registry (read from the named variable)."""
    key = os.environ.get(api_key_env) if api_key_env else None
    return {"Authorization": f"Bearer {key}"} if key else {}


def list_encoders(registry: str, api_key_env: str | None = None) -> list[str]:
    """``GET /list_encoder_urls`` of one prefill's registry."""
    r = http("GET", registry.rstrip("/") + "/list_encoder_urls", timeout=5.0, headers=registry_auth(api_key_env))
    doc = r.json()
    if not r.ok or not isinstance(doc, dict) or not isinstance(doc.get("encoder_urls"), list):
        raise DrainError(f"encoder registry {registry}: GET /list_encoder_urls -> "
                         f"HTTP {r.status} {r.error}")
    return [str(u).rstrip("/") for u in doc["encoder_urls"]]


def unregister_encoder(registries: list[str], url: str, api_key_env: str | None = None) -> list[str]:
    """Remove ``url`` from every registry; returns those that had it. 404 = already gone."""
    had = []
    for reg in registries:
        r = http("DELETE", reg.rstrip("/") + "/unregister_encoder_url", {"url": url}, timeout=5.0,
                 headers=registry_auth(api_key_env))
        if r.ok:
            had.append(reg)
        elif r.status != 404:
            raise DrainError(f"encoder registry {reg}: DELETE /unregister_encoder_url {url} -> "
                             f"HTTP {r.status} {r.error or r.body[:200].decode(errors='replace')}")
    return had


def register_encoder(registries: list[str], url: str, timeout: float = 30.0, api_key_env: str | None = None) -> None:
    """Add ``url`` to every registry and wait until each lists it as healthy."""
    for reg in registries:
        r = http("POST", reg.rstrip("/") + "/register_encoder_url", {"url": url}, timeout=5.0,
                 headers=registry_auth(api_key_env))
        if not r.ok:
            raise DrainError(f"encoder registry {reg}: POST /register_encoder_url {url} -> "
                             f"HTTP {r.status} {r.error or r.body[:200].decode(errors='replace')}")
    want = url.rstrip("/")
    for reg in registries:
        if not _poll(lambda: want in list_encoders(reg, api_key_env), timeout):
            raise DrainError(f"encoder registry {reg} does not list {url} as healthy after "
                             f"{timeout:.0f}s")


# -- in-flight work ----------------------------------------------------------------------------

def loads_idle(url: str) -> bool:
    """No running or waiting request per ``/v1/loads``; a worker without it counts as idle."""
    load = get_loads(url)
    return load is None or (load.running == 0 and load.waiting == 0)


def wait_loads_idle(url: str, timeout: float, quiet: float = 0.3) -> None:
    """Idle per ``/v1/loads`` and still idle ``quiet`` seconds later (a request the router sent
    just before the removal has arrived by then)."""
    def settled() -> bool:
        if not loads_idle(url):
            return False
        time.sleep(quiet)
        return loads_idle(url)
    if not _poll(settled, timeout):
        raise DrainError(f"{url} still has requests in flight after {timeout:.0f}s (/v1/loads)")


def _gauges_read_zero(url: str, m: dict[str, float], gauges: tuple[str, ...]) -> bool:
    if not m:
        return True  # it does not answer: nothing runs on it
    missing = [g for g in gauges if g not in m]
    if missing:
        raise DrainError(f"{url}/metrics has no {', '.join(missing)}: cannot tell when it is idle; "
                         "is it the engine and version the topology names?")
    return all(m[g] == 0 for g in gauges)


def gauges_idle(url: str, gauges: tuple[str, ...], api_key_env: str | None) -> bool:
    """Every one of ``gauges`` on the worker's ``/metrics`` reads 0 (summed over its label sets).
    A worker that does not answer counts as idle (nothing runs on it); one that answers without
    the gauges cannot say and raises."""
    return _gauges_read_zero(url, metrics.worker(url, api_key_env=api_key_env), gauges)


def wait_gauges_idle(url: str, gauges: tuple[str, ...], timeout: float, quiet: float = 0.5, *,
                     api_key_env: str | None, step_counter: str | None = None, settle: float = 5.0) -> None:
    """Idle per ``gauges`` and still idle ``quiet`` seconds later (a request the router sent just
    before the removal is counted by then, once the server has read and prepared it).

    ``step_counter``: a series the engine adds to on every step. vLLM publishes its gauges with
    a step's output, so a request that ends outside a step (a stop string the API server found)
    leaves them above 0 on an idle server; gauges that stay up while the engine has not stepped
    for ``settle`` seconds are stale, and the worker is idle (the router, drained first, has
    nothing in flight on it)."""
    deadline = time.monotonic() + timeout
    steps: float | None = None
    since = time.monotonic()
    while True:
        m = metrics.worker(url, api_key_env=api_key_env)
        if _gauges_read_zero(url, m, gauges):
            time.sleep(quiet)
            if gauges_idle(url, gauges, api_key_env):
                return
        elif step_counter is not None:
            if m.get(step_counter) != steps:
                steps, since = m.get(step_counter), time.monotonic()
            elif time.monotonic() - since >= settle:
                log.info("%s: %s stand above 0 but %s has not moved for %.0fs: stale, idle",
                         url, " + ".join(gauges), step_counter, settle)
                return
        if time.monotonic() >= deadline:
            raise DrainError(f"{url} still has requests running or waiting after {timeout:.0f}s "
                             f"({' + '.join(gauges)} on its /metrics)")
        time.sleep(0.25)


def _sum(values: dict[str, float], suffix: str) -> float:
    return sum(v for k, v in values.items() if k.endswith(suffix))


def wait_encoder_idle(url: str, timeout: float, quiet: float = 0.5, *, api_key_env: str | None) -> None:
    """Queue empty and the request counter unchanged for ``quiet`` seconds."""
    deadline = time.monotonic() + timeout
    last: float | None = None
    since = time.monotonic()
    while time.monotonic() < deadline:
        m = metrics.worker(url, api_key_env=api_key_env)
        done = _sum(m, "requests_total")
        if _sum(m, "queue_depth") > 0 or done != last:
            last, since = done, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return
        time.sleep(0.2)
    raise DrainError(f"encoder {url} still busy after {timeout:.0f}s (queue or requests moving)")


def transfer_bytes(url: str, api_key_env: str | None) -> float:
    """Bytes this worker moved (sent + received) over its transport or inline in an HTTP answer
    (the embedded runtime's small embeddings), from ``/metrics``."""
    m = metrics.worker(url, api_key_env=api_key_env)
    return sum(v for k, v in m.items() if "transport_bytes" in k or "inline_bytes" in k)


# -- SGLang engine control ---------------------------------------------------------------------

def pause_generation(url: str, mode: str = "abort") -> dict[str, Any]:
    """SGLang ``POST /pause_generation``; the engine stops admitting (and aborts per ``mode``)."""
    r = http("POST", url.rstrip("/") + "/pause_generation", {"mode": mode}, timeout=30.0)
    if not r.ok:
        raise DrainError(f"{url}: POST /pause_generation -> HTTP {r.status} {r.error}")
    doc = r.json()
    return doc if isinstance(doc, dict) else {"status": "ok"}


def continue_generation(url: str) -> None:
    """SGLang ``POST /continue_generation`` (undo a pause when a move is abandoned)."""
    r = http("POST", url.rstrip("/") + "/continue_generation", {}, timeout=30.0)
    if not r.ok:
        raise DrainError(f"{url}: POST /continue_generation -> HTTP {r.status} {r.error}")


def drain(role: str, url: str, *, engine: Engine, client: RouterClient | None,
          registries: list[str], timeout: float, api_key_env: str | None = None) -> dict[str, Any]:
    """Take one worker out of service and wait for it to go idle; what was done, for undo."""
    done: dict[str, Any] = {"router": False, "registries": []}
    if role == "encoder" and not engine.routed_encoders:
        done["registries"] = unregister_encoder(registries, url, api_key_env)
        wait_encoder_idle(url, timeout, api_key_env=api_key_env)
        return done
    if client is not None:
        done["router"] = router_remove(client, url, timeout=timeout)
    if engine.idle_gauges:
        wait_gauges_idle(url, engine.idle_gauges, timeout, api_key_env=api_key_env, step_counter=engine.step_counter)
    else:
        wait_loads_idle(url, timeout)
    if engine.pauses_on_drain:
        done["paused"] = pause_generation(url, "abort")
    return done
