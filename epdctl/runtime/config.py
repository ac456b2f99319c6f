"""Every default of a worker's command line, written once (``__main__.build_parser`` reads them).

Request limits keep theirs in limits.py (``Limits``), next to the checks that use them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

FAST_ENV = "EPD_RUNTIME_FAST"  # "1": the fast path by default, as if ``--fast`` were given


def _env_fast() -> bool:
    return os.environ.get(FAST_ENV, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class RuntimeConfig:
    host: str = "127.0.0.1"
    log_level: str = "INFO"
    transport: str = "zmq"
    transfer_port: int = 0                  # 0: any free port
    cache_mb: float = 256.0                 # encoder (and colocated) embedding cache
    max_batch_size: int = 32                # images per vision-tower batch
    batch_wait_ms: float = 0.0              # how long an idle encoder waits for more requests
    max_running_requests: int = 64          # prefill admission and decode batch
    kv_timeout: float = 30.0                # seconds to wait for the KV of a room
    encoder_timeout: float = 60.0           # seconds per encoder call
    encoder_probe_interval: float = 2.0     # encoder health-probe period (0: off)
    fast: bool = False                      # the fast path (fast/); reference otherwise

    @classmethod
    def from_env(cls) -> "RuntimeConfig":
        """The defaults, with those the environment sets (``EPD_LOG_LEVEL``, ``EPD_RUNTIME_FAST``)."""
        return cls(log_level=os.environ.get("EPD_LOG_LEVEL", cls.log_level), fast=_env_fast())

    def default(self, name: str) -> object:
        """The default of the option ``--name`` (dashes or underscores)."""
        return getattr(self, name.lstrip("-").replace("-", "_"))


FIELDS = frozenset(f.name for f in fields(RuntimeConfig))
