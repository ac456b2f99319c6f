"""E->P canary for SGLang encoders: every encoder must have sent embeddings to a prefill.

SGLang's encoders (``--encoder-only``) export no byte counter, but count each embedding
transfer to a prefill in the ``sglang:encoder_transfer_seconds`` histogram. So image requests
(fresh generated images, so no cache answers them) go through the router until every
encoder's transfer count grew, or the attempts run out; an encoder whose count never moved is
named. The destination prefill is not in the metric's labels, so the pair reads
``encoder->prefills``. The embedded engine gets the byte-exact check in ``epdctl.canary.pairs``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from epdctl.http.metrics import fetch, parse
from epdctl.errors import ProbeError

TRANSFERS = "sglang:encoder_transfer_seconds_count"
ITEMS = "sglang:encoder_mm_items_per_request_sum"


@dataclass
class EncoderResult:
    name: str
    transfers: float = 0.0
    items: float = 0.0
    requests: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.transfers > 0

    @property
    def reason(self) -> str:
        if self.error:
            return self.error
        return "" if self.ok else (f"no embedding transfer counted in {self.requests} image "
                                   f"request(s) ({TRANSFERS} did not grow)")

    def to_json(self) -> dict[str, Any]:
        return {"kind": "E->P", "pair": f"{self.name}->prefills", "transfers": self.transfers,
                "items": self.items, "requests": self.requests, "ok": self.ok,
                "reason": self.reason or None}


def encoder_counts(text: str) -> tuple[float, float] | None:
    """(transfers, items) summed over labels; None when the page has no encoder series."""
    m = parse(text)
    t = [v for k, v in m.items() if k.split("{")[0] == TRANSFERS]
    if not t:
        return None
    return sum(t), sum(v for k, v in m.items() if k.split("{")[0] == ITEMS)


def _read(url: str, api_key_env: str | None) -> tuple[float, float] | None:
    r = fetch(url.rstrip("/") + "/metrics", api_key_env=api_key_env)
    return encoder_counts(r.body.decode(errors="replace")) if r.ok else None


def check_encoders(encoders: Sequence[Any], send: Callable[[int], Any], attempts: int = 6, *,
                   api_key_env: str | None) -> list[EncoderResult]:
    """``send(i)`` sends the i-th image request through the router (raising ProbeError on a
    failed answer); stops once every encoder counted a transfer."""
    res = {e.name: EncoderResult(e.name) for e in encoders}
    start = {e.name: _read(e.url, api_key_env) for e in encoders}
    for e in encoders:
        if start[e.name] is None:
            res[e.name].error = (f"{e.name}: no {TRANSFERS} at {e.url}/metrics (start SGLang "
                                 "with --enable-metrics)")
    for i in range(attempts):
        if all(r.ok or r.error for r in res.values()):
            break
        try:
            send(i)
        except ProbeError as err:
            for r in res.values():
                r.requests += 1
                if not r.ok:
                    r.error = f"image request failed: {err}"
            break
        for e in encoders:
            r = res[e.name]
            r.requests += 1
            now, before = _read(e.url, api_key_env), start[e.name]
            if now is not None and before is not None:
                r.transfers = now[0] - before[0]
                r.items = now[1] - before[1]
    return list(res.values())
