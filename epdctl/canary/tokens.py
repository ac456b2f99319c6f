"""P->D token canary over SGLang's native API: the decode's tokens must be the prefill's.

Why this proves the KV moved: in a disaggregated pair the prefill computes the prompt's KV and
the first token, the decode computes every later token from the KV it received. So for a fixed
prompt, each pair runs one request the way the PD router sends it (one bootstrap room,
``/generate`` to both at once), and the decode's greedy tokens are compared with a
*prefill-only* run of the same prefix, position by position (teacher forcing: ``/generate`` on
the prefill with ``bootstrap_host = 2.2.2.2``, SGLang's fake transfer, ``max_new_tokens 1``). A
decode that used a missing, stale or corrupt KV diverges at the second token. A mismatch
where the prefill's top-2 logprobs are within ``tie`` nats is a numerical near-tie (prefill and
decode kernels differ on GPUs), reported, not failed.

Works on SGLang workers and on epdctl's embedded engine alike (both serve ``/tokenize`` and
``/generate``). Bytes come from the prefill's own counters when it exports them: SGLang's
``sglang:kv_transfer_total_mb`` histogram (MiB), or the embedded
``epd_transport_bytes_sent_total``.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence
from urllib.parse import urlsplit

from epdctl.errors import ProbeError
from epdctl.http.probes import http

FAKE_BOOTSTRAP_HOST = "2.2.2.2"   # sglang.srt.disaggregation.utils.FAKE_BOOTSTRAP_HOST
PROMPT = "Picture 1: red circle\nPicture 2: blue square\nPicture 3:"
KV_MIB = "sglang:kv_transfer_total_mb_sum"
KV_COUNT = "sglang:kv_transfer_total_mb_count"
EMBEDDED_SENT = "transport_bytes_sent_total"


@dataclass
class TokenPair:
    """What one prefill->decode pair produced and how it compares."""

    src: str
    dst: str
    tokens: list[int] = field(default_factory=list)      # the decode's output_ids
    reference: list[int] = field(default_factory=list)   # prefill-only greedy token per position
    margins: list[float] = field(default_factory=list)   # top-1 minus top-2 logprob per position
    kv_bytes: float | None = None                        # None: the engine exports no byte counter
    kv_transfers: float | None = None
    byte_source: str | None = None
    first_mismatch: int | None = None
    near_tie: bool = False
    error: str | None = None

    @property
    def label(self) -> str:
        return f"{self.src}->{self.dst}"

    @property
    def ok(self) -> bool:
        if self.error or len(self.tokens) < 2:
            return False
        if self.kv_bytes is not None and self.kv_bytes <= 0:
            return False
        return self.first_mismatch is None or self.near_tie

    @property
    def reason(self) -> str:
        if self.error:
            return self.error
        if len(self.tokens) < 2:
            return (f"the decode returned {len(self.tokens)} token(s); at least 2 are needed (the "
                    "first comes from the prefill)")
        if self.kv_bytes is not None and self.kv_bytes <= 0:
            return f"{self.src} moved no KV bytes by its own counters ({self.byte_source})"
        k = self.first_mismatch
        if k is not None and not self.near_tie:
            return (f"token {k}: the decode produced {self.tokens[k]}, the prefill alone predicts "
                    f"{self.reference[k]} (margin {self.margins[k]:.3f} nats): the decode did not "
                    "use this prefill's KV")
        if k is not None:
            return f"near tie at token {k} (margin {self.margins[k]:.4f} nats); earlier tokens match"
        return ""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "pair": self.label, "kind": "P->D", "ok": self.ok,
                "reason": self.reason or None}


def _post(url: str, body: dict[str, Any], what: str, timeout: float) -> dict[str, Any]:
    r = http("POST", url, body, timeout=timeout)
    doc = r.json() if r.ok else None
    if not isinstance(doc, dict):
        detail = r.error or r.body[:200].decode(errors="replace")
        raise ProbeError(f"{what}: HTTP {r.status} {detail}".strip())
    return doc


def kv_counters(url: str, api_key_env: str | None) -> tuple[float | None, float | None, str | None]:
    """(KV bytes sent, transfers, source) from a prefill's /metrics; Nones when not exported."""
    from epdctl.http.metrics import fetch, parse

    r = fetch(url.rstrip("/") + "/metrics", api_key_env=api_key_env)
    if not r.ok:
        return None, None, None
    m = parse(r.body.decode(errors="replace"))
    mib = [v for k, v in m.items() if k.split("{")[0] == KV_MIB]
    if mib:
        cnt = sum(v for k, v in m.items() if k.split("{")[0] == KV_COUNT)
        return sum(mib) * 1024 * 1024, cnt, KV_MIB.removesuffix("_sum")
    sent = [v for k, v in m.items() if k.split("{")[0].endswith(EMBEDDED_SENT)]
    if sent:
        return sum(sent), None, "epd_transport_bytes_sent_total"
    return None, None, None


def reference_tokens(prefill: Any, ids: list[int], n: int, timeout: float,
                     decode_tokens: list[int]) -> tuple[list[int], list[float]]:
    """Teacher-forced greedy tokens of the prefill alone for ``ids + decode_tokens[:k]``."""
    ref, margins = [], []
    for k in range(n):
        body = {"input_ids": ids + decode_tokens[:k], "return_logprob": True, "top_logprobs_num": 2,
                "sampling_params": {"temperature": 0.0, "max_new_tokens": 1},
                "bootstrap_host": FAKE_BOOTSTRAP_HOST, "bootstrap_room": random.getrandbits(62)}
        doc = _post(prefill.url + "/generate", body, f"prefill-only run on {prefill.name}", timeout)
        out = doc.get("output_ids") or []
        if not out:
            raise ProbeError(f"prefill-only run on {prefill.name}: no output_ids in the answer")
        ref.append(int(out[0]))
        top = ((doc.get("meta_info") or {}).get("output_top_logprobs") or [[]])[0]
        lps = sorted((float(t[0]) for t in top if t and t[0] is not None), reverse=True)
        margins.append(lps[0] - lps[1] if len(lps) >= 2 else float("inf"))
    return ref, margins


def check_pair(prefill: Any, decode: Any, *, api_key_env: str | None, tokens: int = 8,
               tie: float = 0.05, prompt: str = PROMPT, timeout: float = 120.0,
               settle: float = 5.0) -> TokenPair:
    """One pair: the router-style run, its prefill-only reference, and the KV bytes (read with
    the key held by ``api_key_env``). A prefill counts a send when it completes, on its own
    side (the decode's acknowledgement), which can come after the decode already answered: the
    counters are read again for up to ``settle`` seconds before "no KV bytes" is concluded."""
    res = TokenPair(prefill.name, decode.name)
    try:
        tok = _post(prefill.url + "/tokenize", {"prompt": prompt, "add_special_tokens": False},
                    f"tokenize on {prefill.name}", timeout)
        ids = [int(i) for i in tok.get("tokens") or []]
        if not ids:
            raise ProbeError(f"tokenize on {prefill.name}: no tokens for the canary prompt")
        host = urlsplit(prefill.url).hostname or prefill.host
        body = {"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": tokens,
                                                      "ignore_eos": True},
                "bootstrap_host": host, "bootstrap_port": prefill.bootstrap_port,
                "bootstrap_room": random.getrandbits(62)}
        before = kv_counters(prefill.url, api_key_env)
        with ThreadPoolExecutor(2) as pool:
            fp = pool.submit(_post, prefill.url + "/generate", body, f"prefill {prefill.name}", timeout)
            fd = pool.submit(_post, decode.url + "/generate", body, f"decode {decode.name}", timeout)
            fp.result()
            out = fd.result()
        after = kv_counters(prefill.url, api_key_env)
        deadline = time.monotonic() + settle
        while (before[0] is not None and after[0] is not None and after[0] <= before[0]
               and time.monotonic() < deadline):
            time.sleep(0.2)
            after = kv_counters(prefill.url, api_key_env)
        res.tokens = [int(i) for i in out.get("output_ids") or []]
        if before[0] is not None and after[0] is not None:
            res.kv_bytes = after[0] - before[0]
            res.byte_source = after[2]
            if before[1] is not None and after[1] is not None:
                res.kv_transfers = after[1] - before[1]
        res.reference, res.margins = reference_tokens(prefill, ids, len(res.tokens), timeout,
                                                      res.tokens)
    except ProbeError as e:
        res.error = str(e)
        return res
    res.first_mismatch = next((k for k, (a, b) in enumerate(zip(res.tokens, res.reference))
                               if a != b), None)
    if res.first_mismatch is not None:
        res.near_tie = res.margins[res.first_mismatch] < tie
    return res


def role_of(w: Any) -> str:
    """A worker's role as text, from a plan's ProcessSpec or a recorded process."""
    return str(getattr(w.role, "value", w.role))


def check_pairs(workers: Sequence[Any], *, api_key_env: str | None, **kw: Any) -> list[TokenPair]:
    """Every prefill x decode pair among the leaders of ``workers``."""
    lead = [w for w in workers if getattr(w, "is_leader", True)]
    pres = [w for w in lead if role_of(w) == "prefill"]
    decs = [w for w in lead if role_of(w) == "decode"]
    if not pres or not decs:
        raise ProbeError(f"token canary: no prefill/decode pair ({len(pres)} prefill, "
                         f"{len(decs)} decode)")
    return [check_pair(p, d, api_key_env=api_key_env, **kw) for p in pres for d in decs]
