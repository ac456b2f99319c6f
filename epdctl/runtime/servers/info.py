"""Discovery and status endpoints every prefill/decode/colocated worker serves (SGLang's shapes).

smg calls ``/health``, ``/v1/models``, ``/server_info`` and ``/model_info`` to register a
worker and polls ``/v1/loads`` and ``/metrics`` (the latter with the cluster's API key when there is
one, which smg sends to its workers); these answer from memory, never touch the
model, so they stay fast while a forward pass runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from aiohttp import web

from epdctl.runtime.metrics import Registry
from epdctl.runtime.servers.auth import require_bearer
from epdctl.runtime.servers.common import json_response, version


@dataclass
class WorkerInfo:
    role: str                       # "prefill" | "decode" | "colocated"
    served_name: str
    model_path: str
    transport: str | None
    max_running_requests: int
    max_images_per_request: int
    context_length: int
    bootstrap_port: int | None = None
    encoder_bootstrap_port: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    api_key: str | None = field(default=None, repr=False)  # /metrics answers only with it (auth.py)
    started: float = field(default_factory=time.time)

    @property
    def disaggregation_mode(self) -> str:
        return self.role if self.role in ("prefill", "decode") else "null"

    def server_info(self) -> dict[str, Any]:
        return {
            "served_model_name": self.served_name, "model_path": self.model_path,
            "disaggregation_mode": self.disaggregation_mode,
            "disaggregation_bootstrap_port": self.bootstrap_port,
            "encoder_bootstrap_port": self.encoder_bootstrap_port,
            "max_running_requests": self.max_running_requests,
            "max_images_per_request": self.max_images_per_request,
            "context_length": self.context_length, "transport": self.transport,
            "version": version(), "runtime": "epdctl", "role": self.role, **self.extra,
        }

    def model_info(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "served_model_name": self.served_name, "is_generation": True,
                "disaggregation_mode": self.disaggregation_mode, "has_image_understanding": True,
                "architectures": ["Qwen2VLForConditionalGeneration"], "context_length": self.context_length}

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.served_name, "object": "model", "created": int(self.started),
                                            "owned_by": "epdctl", "root": self.model_path,
                                            "max_model_len": self.context_length}]}


Loads = Callable[[], dict[str, int]]


def add_info_routes(app: web.Application, info: WorkerInfo, metrics: Registry, loads: Loads,
                    health_generate: Callable[[], Awaitable[dict[str, Any]]]) -> None:
    """Mount /health, /health_generate, /server_info, /model_info, /v1/models, /v1/loads, /metrics."""

    async def health(_: web.Request) -> web.Response:
        return json_response({"status": "ok", "role": info.role})

    async def health_gen(_: web.Request) -> web.Response:
        return json_response({"status": "ok", "role": info.role, **(await health_generate())})

    async def server_info(_: web.Request) -> web.Response:
        return json_response(info.server_info())

    async def model_info(_: web.Request) -> web.Response:
        return json_response(info.model_info())

    async def models(_: web.Request) -> web.Response:
        return json_response(info.models())

    async def v1_loads(_: web.Request) -> web.Response:
        cur = loads()
        total = max(1, info.context_length * info.max_running_requests)
        used = int(cur.get("num_used_tokens", 0))
        return json_response({"timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "dp_rank_count": 1,
                              "loads": [{"dp_rank": 0, "num_running_reqs": int(cur.get("num_running_reqs", 0)),
                                         "num_waiting_reqs": int(cur.get("num_waiting_reqs", 0)),
                                         "num_used_tokens": used, "max_total_num_tokens": total,
                                         "token_usage": round(used / total, 6),
                                         "max_running_requests": info.max_running_requests}]})

    async def metrics_h(request: web.Request) -> web.Response:
        require_bearer(request, info.api_key, "/metrics")
        return web.Response(text=metrics.render(), content_type="text/plain")

    for path, handler in (("/health", health), ("/health_generate", health_gen), ("/server_info", server_info),
                          ("/get_server_info", server_info), ("/model_info", model_info),
                          ("/get_model_info", model_info), ("/v1/models", models), ("/v1/loads", v1_loads),
                          ("/metrics", metrics_h)):
        app.router.add_get(path, handler)


def transport_metrics(metrics: Registry, transport: Any, inline: dict[str, int] | None = None) -> None:
    """Bytes and transfers moved by this worker's transport, labelled by direction. ``inline``:
    bytes of hand-offs that travelled inline in an HTTP answer instead (``{"bytes_sent": n,
    "bytes_received": n}``, encode_api.py), counted apart: a canary must know which path moved them."""
    def stat(key: str) -> Callable[[], float]:
        return lambda: float(transport.stats.get(key, 0))

    def inl(key: str) -> Callable[[], float]:
        return lambda: float((inline or {}).get(key, 0))

    metrics.counter_fn("transport_bytes_sent_total", "Bytes sent over the transport", stat("bytes_sent"))
    metrics.counter_fn("transport_bytes_received_total", "Bytes received over the transport",
                       stat("bytes_received"))
    helps = {"bytes_sent": "Hand-off bytes sent inline in an HTTP answer",
             "bytes_received": "Hand-off bytes received inline in an HTTP answer (embeddings that came as "
                               "an encoder's /encode answer)"}
    for key in inline or {}:  # only the directions this role has
        metrics.counter_fn(f"inline_{key}_total", helps[key], inl(key))
    metrics.counter_fn("transport_transfers_sent_total", "Messages sent over the transport", stat("transfers_sent"))
    metrics.counter_fn("transport_transfers_received_total", "Messages received over the transport",
                       stat("transfers_received"))
    metrics.counter_fn("transport_failures_total", "Failed transfers", stat("failures"))
    metrics.counter_fn("transport_connects_total", "Connections opened to peers (reused afterwards)", stat("connects"))
    metrics.counter_fn("transport_shm_sent_total", "Messages sent through shared memory (same host)", stat("shm_sent"))
