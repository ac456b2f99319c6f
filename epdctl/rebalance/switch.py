"""In-place role switches: ask a running, drained worker to change role without a restart.

embedded (started ``--switchable``): ``POST /admin/switch_role {"argv": [role, flags...]}``, the
new role's rendered command line after ``python -m epdctl.runtime``; the worker answers
``{"success", "old_role", "new_role", "seconds", "pid"}`` and restores its old role itself if
the new one cannot start.
SGLang 0.5.23 (started ``--enable-pd-role-switch``): ``POST /pd_role_switch`` with
``PdRoleSwitchReqInput`` (``sglang/srt/managers/io_struct.py``): ``{"new_role": "prefill" |
"decode", "decode_cuda_graph_memory_gb": float}``; the answer is ``PdRoleSwitchReqOutput``
``{"success", "message", "old_role", "new_role", "safe_to_restore"}``, HTTP 400 when it failed.
A flip to decode that captures decode CUDA graphs needs the graph footprint, which a decode
peer reports in ``GET /server_info`` ``internal_states[0].decode_cuda_graph_memory_gb``.
Both routes take ``Authorization: Bearer KEY`` when the cluster has an API key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from epdctl.errors import ProbeError
from epdctl.http.probes import http



class SwitchError(ProbeError):
    """A worker refused or failed an in-place role switch."""

    def __init__(self, message: str, restorable: bool = True):
        super().__init__(message)
        self.restorable = restorable   # the worker still serves its old role


@dataclass(frozen=True)
class Switched:
    old_role: str
    new_role: str
    seconds: float


def runtime_argv(argv: list[str] | tuple[str, ...]) -> list[str]:
    """``python -m epdctl.runtime decode --port ...`` -> ``["decode", "--port", ...]``."""
    argv = list(argv)
    if "epdctl.runtime" not in argv:
        raise SwitchError(f"not an embedded runtime command: {' '.join(argv[:4])} ...")
    return argv[argv.index("epdctl.runtime") + 1:]


def _headers(api_key_env: str | None) -> dict[str, str]:
    key = os.environ.get(api_key_env) if api_key_env else None
    return {"Authorization": f"Bearer {key}"} if key else {}


def _answer(url: str, path: str, r: Any) -> dict[str, Any]:
    doc = r.json()
    if r.status == 0:
        raise SwitchError(f"{url}: POST {path}: no answer ({r.error})", restorable=False)
    if not r.ok or not isinstance(doc, dict) or doc.get("success") is False:
        err = doc.get("error") if isinstance(doc, dict) else None
        msg = (doc.get("message") or (err.get("message") if isinstance(err, dict) else err)
               if isinstance(doc, dict) else None)
        restorable = bool(doc.get("safe_to_restore", True)) if isinstance(doc, dict) else True
        raise SwitchError(f"{url}: POST {path} -> HTTP {r.status}: "
                          f"{msg or r.body[:200].decode(errors='replace')}", restorable)
    return doc


def switch_embedded(url: str, new_argv: list[str] | tuple[str, ...], *, api_key_env: str | None = None,
                    timeout: float = 120.0) -> Switched:
    """Switch a ``--switchable`` embedded worker to the role of ``new_argv``."""
    path = "/admin/switch_role"
    r = http("POST", url.rstrip("/") + path, {"argv": runtime_argv(new_argv)}, timeout=timeout,
             headers=_headers(api_key_env))
    doc = _answer(url, path, r)
    return Switched(str(doc.get("old_role", "")), str(doc.get("new_role", "")), float(doc.get("seconds", 0.0)))


def decode_graph_gb(decode_urls: list[str]) -> float:
    """The decode CUDA-graph footprint a decode peer reports (0.0 when none does: no graphs)."""
    for url in decode_urls:
        r = http("GET", url.rstrip("/") + "/server_info", timeout=5.0)
        doc = r.json() if r.ok else None
        states = doc.get("internal_states") if isinstance(doc, dict) else None
        if isinstance(states, list) and states and isinstance(states[0], dict):
            value = states[0].get("decode_cuda_graph_memory_gb")
            if isinstance(value, (int, float)):
                return float(value)
    return 0.0


def switch_sglang(url: str, new_role: str, *, decode_urls: list[str], api_key_env: str | None = None,
                  timeout: float = 600.0) -> Switched:
    """Flip an ``--enable-pd-role-switch`` SGLang worker between prefill and decode."""
    if new_role not in ("prefill", "decode"):
        raise SwitchError(f"SGLang switches only prefill <-> decode, not to {new_role}")
    body: dict[str, Any] = {"new_role": new_role}
    if new_role == "decode":
        body["decode_cuda_graph_memory_gb"] = decode_graph_gb(decode_urls)
    path = "/pd_role_switch"
    r = http("POST", url.rstrip("/") + path, body, timeout=timeout, headers=_headers(api_key_env))
    doc = _answer(url, path, r)
    return Switched(str(doc.get("old_role", "")), str(doc.get("new_role", new_role)), r.seconds)


def switch_role(protocol: str, url: str, new_role: str, new_argv: list[str] | tuple[str, ...], *,
                decode_urls: list[str], api_key_env: str | None = None, timeout: float = 600.0) -> Switched:
    """Switch a drained worker in place over the engine's ``protocol`` (``RoleSwitch.protocol``)."""
    if protocol == "pd_role_switch":
        return switch_sglang(url, new_role, decode_urls=decode_urls, api_key_env=api_key_env, timeout=timeout)
    if protocol == "admin_switch_role":
        return switch_embedded(url, new_argv, api_key_env=api_key_env, timeout=timeout)
    raise SwitchError(f"{url}: no in-place switch over {protocol!r}", restorable=True)
