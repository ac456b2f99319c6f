"""Resolve what to measure: a recorded cluster (router + workers' metrics) or a bare URL.

A cluster gives everything: the router URL, the served model, the API key variable, and every
worker's ``/metrics`` plus the router's Prometheus listener, so the report can include stage
times and bytes moved. A URL (any OpenAI-compatible server) gives only the endpoint; metrics
pages can still be named explicitly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from epdctl.bench.client import Target, discover_model
from epdctl.http.metrics import Endpoint
from epdctl.errors import EpdctlError
from epdctl.state.store import ClusterState, resolve_cluster


@dataclass
class Resolved:
    """The target to load and the pages to scrape (and the cluster's run folder, if any)."""

    target: Target
    endpoints: list[Endpoint] = field(default_factory=list)
    cluster_dir: Path | None = None
    state: ClusterState | None = None
    api_key_env: str | None = None  # the variable holding the key the metrics pages want


def cluster_endpoints(state: ClusterState) -> list[Endpoint]:
    """Every worker's /metrics and the router's Prometheus page (its recorded port)."""
    eps = [Endpoint(p.name, p.role, p.url.rstrip("/") + "/metrics")
           for p in state.workers if p.is_leader]
    r = state.router
    if r is not None:
        port, host = r.prometheus_port, r.host
        if port:
            if host in ("0.0.0.0", "::"):
                host = "127.0.0.1"
            eps.append(Endpoint("router", "router", f"http://{host}:{port}/metrics"))
    return eps


def resolve(arg: str | None, *, model: str | None = None, api_key_env: str | None = None,
            metrics_urls: tuple[str, ...] = ()) -> Resolved:
    """CLUSTER name, URL, or None (the only recorded cluster) -> what to load and scrape."""
    if arg and arg.startswith(("http://", "https://")):
        key = _key(api_key_env)
        model = model or discover_model(arg, key)
        if not model:
            raise EpdctlError(f"{arg}/v1/models lists no model (or does not answer); pass "
                              "--model NAME, and check the URL")
        eps = [Endpoint(f"metrics{i}", "external", u) for i, u in enumerate(metrics_urls)]
        return Resolved(Target(arg.rstrip("/"), model, key), eps, api_key_env=api_key_env)
    cdir = resolve_cluster(arg)
    state = cdir.load()
    if state is None or state.router is None:
        raise EpdctlError(f"cluster {cdir.name!r} has no router recorded; benchmark a URL "
                          "instead (epdctl bench http://HOST:PORT)")
    key = _key(api_key_env or state.api_key_env)
    model = model or state.model or discover_model(state.router.url, key)
    if not model:
        raise EpdctlError(f"cannot tell which model cluster {cdir.name!r} serves; pass --model")
    eps = cluster_endpoints(state) + [Endpoint(f"metrics{i}", "external", u)
                                      for i, u in enumerate(metrics_urls)]
    return Resolved(Target(state.router.url, model, key), eps, cdir.root, state,
                    api_key_env or state.api_key_env)


def _key(env: str | None) -> str | None:
    if not env:
        return None
    val = os.environ.get(env)
    if not val:
        raise EpdctlError(f"API key variable {env} is not set; export it or drop --api-key-env")
    return val
