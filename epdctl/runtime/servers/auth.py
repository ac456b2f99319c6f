"""The cluster's API key on a worker's own endpoints (Bearer, like smg's ``--api-key``).

With a key (``--api-key-env NAME``), these answer only ``Authorization: Bearer KEY``: the encoder
registry, ``POST /admin/switch_role``, the KV bootstrap (``/kv/route``, ``/kv/room/{room}``) and
every worker's ``/metrics`` (smg sends its ``--api-key`` to the workers; Prometheus reads the key
from a ``credentials_file``, see docs/limits.md). Without a key they stay open, loopback only.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from epdctl.runtime.openai_api import ApiError


def require_bearer(request: web.Request, api_key: str | None, what: str) -> None:
    """ApiError 401 unless ``request`` carries ``Bearer api_key`` (nothing to check without a key)."""
    if not api_key:
        return
    given = request.headers.get("Authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
        raise ApiError(401, f"{what} needs the cluster's API key (Authorization: Bearer KEY)", "invalid_api_key")
