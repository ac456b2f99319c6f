"""vLLM's transfers proven by what the engine and its store show (``transfer.backend:
shared-storage``): around one image request through the router,

* KV prefill->decode: every decode's ``vllm:prompt_tokens_by_source_total{source=
  "external_kv_transfer"}`` grows (prompt tokens its KV connector loaded instead of computing);
  ExampleConnector moves whole 32-token blocks of the prompt but its last token, so a prompt
  under ~34 tokens moves nothing: the canary's three images are ~72 tokens;
* embeddings encoder->prefill: files and bytes appear under the store's ``ec/`` directory
  (ECExampleConnector writes one ``encoder_cache.safetensors`` per image), and every encoder's
  ``vllm:request_success_total`` grows; the KV blocks land under ``kv/``.

The store is read where it is visible from here (the local launcher, or nodes sharing this
machine's filesystem); elsewhere only the engines' counters speak.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from epdctl.http.metrics import page
from epdctl.http.metrics_summary import total


@dataclass
class ConnectorProof:
    """What one request moved, per hop: counter deltas and store growth (None: not readable)."""

    kv_tokens: dict[str, float | None] = field(default_factory=dict)  # decode -> external KV tokens
    encoded: dict[str, float | None] = field(default_factory=dict)  # encoder -> requests served
    store: dict[str, tuple[int, int] | None] = field(default_factory=dict)  # ec|kv -> (files, bytes) added

    def missing(self) -> list[str]:
        """Each hop with no evidence of a transfer."""
        out = [f"{name} loaded no KV from the prefill (vllm:prompt_tokens_by_source_total"
               f"{{source=\"external_kv_transfer\"}} did not grow)" for name, v in self.kv_tokens.items() if not v]
        out += [f"nothing was written under the store's {sub}/" for sub, v in self.store.items()
                if v is not None and v[0] <= 0]
        if self.store.get("ec") is None:  # the store is not visible here: the encoders' counters speak
            out += [f"{name} served no encode request" for name, v in self.encoded.items() if not v]
        return out

    def lines(self) -> list[str]:
        out = [f"  KV:       {name} loaded {v:.0f} prompt tokens through the KV connector"
               for name, v in self.kv_tokens.items() if v]
        out += [f"  encode:   {name} encoded {v:.0f} image(s)" for name, v in self.encoded.items() if v]
        out += [f"  store:    {sub}/ +{v[0]} file(s), +{v[1]} bytes" for sub, v in self.store.items() if v]
        return out


def _walk(root: str) -> tuple[int, int] | None:
    if not os.path.isdir(root):
        return None
    files = size = 0
    for base, _, names in os.walk(root):
        for n in names:
            try:
                size += os.path.getsize(os.path.join(base, n))
                files += 1
            except OSError:
                continue
    return files, size


def counters(workers: Sequence[Any], api_key_env: str | None) -> dict[str, float | None]:
    """Per worker (``name``, ``url``, ``role``): a decode's prompt tokens loaded through the KV
    connector, another role's finished requests; None where ``/metrics`` does not answer."""
    out: dict[str, float | None] = {}
    for w in workers:
        samples = page(w.url.rstrip("/") + "/metrics", api_key_env=api_key_env)
        if samples is None:
            out[w.name] = None
        elif w.role == "decode":
            out[w.name] = total(samples, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") or 0.0
        else:
            out[w.name] = total(samples, "vllm:request_success_total") or 0.0
    return out


def prove(workers: Sequence[Any], stores: Sequence[str], action: Callable[[], Any], *,
          api_key_env: str | None) -> tuple[Any, ConnectorProof]:
    """Run ``action`` (a request through the router) and what each hop moved over it."""
    lead = [w for w in workers if getattr(w, "is_leader", True) and str(w.role) in ("encoder", "decode")]
    subdirs = {sub: [os.path.join(d, sub) for d in stores] for sub in ("ec", "kv")}

    def store() -> dict[str, tuple[int, int] | None]:
        out: dict[str, tuple[int, int] | None] = {}
        for sub, roots in subdirs.items():
            seen = [s for s in (_walk(r) for r in roots) if s is not None]
            out[sub] = (sum(s[0] for s in seen), sum(s[1] for s in seen)) if seen else None
        return out

    c0, s0 = counters(lead, api_key_env), store()
    result = action()
    c1, s1 = counters(lead, api_key_env), store()
    proof = ConnectorProof()
    for w in lead:
        a, b = c0[w.name], c1[w.name]
        d = None if a is None or b is None else b - a
        (proof.kv_tokens if w.role == "decode" else proof.encoded)[w.name] = d
    for sub in subdirs:
        a2, b2 = s0[sub], s1[sub]
        if a2 is None and b2 is not None:
            a2 = (0, 0)
        proof.store[sub] = None if a2 is None or b2 is None else (b2[0] - a2[0], b2[1] - a2[1])
    return result, proof
