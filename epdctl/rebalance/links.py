"""Post-move link checks: prove data really moves through the moved worker.

Why not only a canary through the router: smg's default cache-aware policy keeps sending a
shared prompt prefix to the decode that already holds it, so a freshly added decode may see no
traffic at all. For prefill/decode the check therefore does what the router does, directly: the
same request to a prefill and a decode with one bootstrap room, and the answer must be well
formed and the moved worker's transport byte counter must grow. Encoders are reached through
the router (the prefills place images on encoders by content hash, so a few canaries suffice).
vLLM's workers are reached through the router too (epdctl-epd picks the least-loaded worker of a
role, round-robin among equals, so a new worker is reached within a few canaries), and its own
counters say it served: a decode's prompt tokens loaded through the KV connector, another
role's finished requests.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlsplit

from epdctl.engines.base import Engine
from epdctl.errors import ProbeError
from epdctl.http.probes import http
from epdctl.rebalance.drain import transfer_bytes
from epdctl.render.plan import Plan


def _request(seed: int, model: str | None, n_images: int = 3) -> tuple[dict[str, Any], int]:
    from epdctl import shapes
    from epdctl.canary import build_messages

    rng = random.Random(seed)
    pngs, question, _ = shapes.make_request(rng, n_images, plain=True)
    body = {"model": model or "default", "messages": build_messages(pngs, question),
            "max_tokens": 32, "temperature": 0.0, "stream": False}
    return body, n_images


def _answer(doc: Any, n: int, where: str) -> str:
    from epdctl import shapes

    try:
        text = str(doc["choices"][0]["message"]["content"] or "")
    except (KeyError, IndexError, TypeError) as e:
        raise ProbeError(f"link check: malformed completion from {where} ({e})") from e
    if all(item is None for item in shapes.parse_answer(text, n)):
        raise ProbeError(f"link check: answer from {where} names no image: {text[:120]!r}")
    return text


def pd_pair(prefill: Any, decode: Any, model: str | None, seed: int = 0,
            timeout: float = 120.0, force_transport: bool = False) -> dict[str, Any]:
    """One disaggregated request on exactly this prefill/decode pair (as the router sends it).
    ``force_transport``: the embedded prefill takes every embedding over the E->P transport, even
    one small enough to come inline (other engines ignore the field)."""
    body, n = _request(seed, model)
    if force_transport:
        body["epd_force_transport"] = True
    host = urlsplit(prefill.url).hostname or prefill.host
    body.update(bootstrap_host=host, bootstrap_port=prefill.bootstrap_port,
                bootstrap_room=random.Random(seed).getrandbits(62))
    with ThreadPoolExecutor(2) as pool:
        fp = pool.submit(http, "POST", prefill.url + "/v1/chat/completions", body,
                         timeout=timeout)
        fd = pool.submit(http, "POST", decode.url + "/v1/chat/completions", body,
                         timeout=timeout)
        rp, rd = fp.result(), fd.result()
    if not rp.ok:
        raise ProbeError(f"link check: prefill {prefill.name} answered HTTP {rp.status} "
                         f"{rp.error or rp.body[:200].decode(errors='replace')}")
    if not rd.ok:
        raise ProbeError(f"link check: decode {decode.name} answered HTTP {rd.status} "
                         f"{rd.error or rd.body[:200].decode(errors='replace')}")
    return {"answer": _answer(rd.json(), n, decode.name), "pair": f"{prefill.name}->{decode.name}"}


def verify(spec: Any, role: str, plan: Plan, *, engine: Engine, router_url: str | None, model: str | None,
           api_key_env: str | None, attempts: int = 8) -> dict[str, Any]:
    """Data moved through ``spec`` in its new role; ProbeError when nothing moved. An engine whose
    pairs cannot be driven directly (vLLM: ``Canary.connectors``) is checked through the router,
    which spreads requests over a role's workers, by the worker's own counters."""
    counted = _counter(spec, role, engine, api_key_env)
    start = counted()
    leaders = [w for w in plan.workers if w.is_leader and w.name != spec.name]
    direct = not engine.canary.connectors
    detail: dict[str, Any] = {}
    for attempt in range(attempts):
        if direct and role == "decode":
            pre = next((w for w in leaders if w.role == "prefill"), None)
            if pre is None:
                raise ProbeError("link check: no prefill to pair the new decode with")
            detail = pd_pair(pre, spec, model, seed=attempt)
        elif direct and role == "prefill":
            dec = next((w for w in leaders if w.role == "decode"), None)
            if dec is None:
                raise ProbeError("link check: no decode to pair the new prefill with")
            detail = pd_pair(spec, dec, model, seed=attempt)
        else:
            if router_url is None:
                return {"skipped": "no router to send a canary through"}
            from epdctl.canary import run_canary

            c = run_canary(router_url, model=model, api_key_env=api_key_env, n_images=4,
                           seed=1000 + attempt)
            detail = {"answer": c.answer, "correct": c.correct}
        moved = counted() - start
        if moved > 0:
            unit = "bytes" if direct else "kv_tokens" if role == "decode" else "served"
            return {**detail, unit: moved, "requests": attempt + 1}
    what = ("loaded no KV through its connector" if engine.canary.connectors and role == "decode" else
            "served no request" if engine.canary.connectors else "moved no bytes over its transport")
    raise ProbeError(f"link check: {spec.name} ({role}) {what} after {attempts} requests")


def _counter(spec: Any, role: str, engine: Engine, api_key_env: str | None) -> Callable[[], float]:
    """What grows when data goes through ``spec``: its transport bytes, or (vLLM's connectors) a
    decode's prompt tokens loaded through the KV connector, another role's finished requests."""
    if not engine.canary.connectors:
        return lambda: transfer_bytes(spec.url, api_key_env)
    from epdctl.canary.connectors import counters

    probe = _Probe(spec.name, spec.url, role)
    return lambda: counters([probe], api_key_env).get(spec.name) or 0.0


@dataclass(frozen=True)
class _Probe:
    name: str
    url: str
    role: str
