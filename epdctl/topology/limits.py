"""The ``limits:`` section: what one request may ask of the cluster (docs/limits.md).

Defaults are safe on a CPU host and equal the embedded runtime's own flag defaults
(tests/test_limits_render.py checks that they agree); the renderer passes only the keys a
topology sets to the runtime, and the body limit to the smg router as ``--max-payload-size``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from epdctl.topology.reader import Reader
from epdctl.topology.safety import is_host

DEFAULTS: dict[str, Any] = {
    "max_body_bytes": 64 * 1024 * 1024,
    "max_prompt_tokens": 0,            # 0: the model's context length
    "max_image_bytes": 16 * 1024 * 1024,
    "max_image_pixels": 4096 * 4096,
    "max_request_pixels": 2 * 4096 * 4096,
    "max_images_per_request": 16,
    "image_fetch_hosts": (),           # no remote image fetches: data: URLs only
    "image_fetch_timeout_s": 10.0,
}
LIMIT_KEYS = tuple(DEFAULTS)
MAX_VALUE = 1 << 40


@dataclass(frozen=True)
class Limits:
    """Every value, default included; ``given`` names the keys the topology set."""

    max_body_bytes: int = DEFAULTS["max_body_bytes"]
    max_prompt_tokens: int = DEFAULTS["max_prompt_tokens"]
    max_image_bytes: int = DEFAULTS["max_image_bytes"]
    max_image_pixels: int = DEFAULTS["max_image_pixels"]
    max_request_pixels: int = DEFAULTS["max_request_pixels"]
    max_images_per_request: int = DEFAULTS["max_images_per_request"]
    image_fetch_hosts: tuple[str, ...] = DEFAULTS["image_fetch_hosts"]
    image_fetch_timeout_s: float = DEFAULTS["image_fetch_timeout_s"]
    given: frozenset[str] = frozenset()


def read_limits(r: Reader, top: dict[str, Any]) -> Limits:
    m = r.section(top, "limits", LIMIT_KEYS)
    if m is None:
        return Limits()
    values: dict[str, Any] = {}
    for f in fields(Limits):
        if f.name not in LIMIT_KEYS or m.get(f.name) is None:
            continue
        if f.name == "image_fetch_hosts":
            hosts = r.get(m, "limits", f.name, "strlist", default=())
            bad = [h for h in hosts if not is_host(h)]
            if bad:
                r.problem(f"limits.{f.name}", f"{bad[0]!r} is not a host name or IP address")
                continue
            values[f.name] = hosts
        elif f.name == "image_fetch_timeout_s":
            v = r.get(m, "limits", f.name, "float")
            if v is not None and not 0 < v <= 600:
                r.problem(f"limits.{f.name}", f"{f.name} must be in (0, 600] seconds, got {v}")
            elif v is not None:
                values[f.name] = float(v)
        else:
            v = r.get(m, "limits", f.name, "int", minimum=0 if f.name == "max_prompt_tokens" else 1,
                      maximum=MAX_VALUE)
            if v is not None:
                values[f.name] = v
    return Limits(**values, given=frozenset(values))
