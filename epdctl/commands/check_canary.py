"""`epdctl check --canary [CLUSTER]`: every transfer pair of a running cluster, proven.

Why a separate command path: the preflight judges a topology before launch; this one talks to
the recorded workers of a running cluster (resolved as `epdctl status` resolves it). Per engine:

* every engine with SGLang's native API (SGLang, the embedded engine): each prefill->decode
  pair's greedy tokens against a prefill-only run of the same prefix, with the KV bytes the
  prefill counted (``token_canary``);
* embedded: also image requests on every pair with each worker's transport bytes
  (``pair_canary``), so every encoder->prefill pair is byte-counted;
* SGLang with encoders: each encoder's embedding-transfer count grows under image requests
  through the router (``encoder_canary``).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from epdctl.commands.canary_view import render_encoders, render_pairs, render_tokens
from epdctl.commands.cluster import _cluster_arg
from epdctl.errors import EpdctlError
from epdctl.state import resolve_cluster


def check_canary(cluster: str | None, as_json: bool) -> None:
    from epdctl.token_canary import check_pairs

    cdir = resolve_cluster(_cluster_arg(cluster))
    state = cdir.load()
    if state is None:
        raise EpdctlError(f"cluster {cdir.name!r} is not running (nothing recorded); start it "
                          "with `epdctl up TOPOLOGY`")
    workers = state.workers
    engine = state.engine
    if engine not in ("embedded", "sglang"):
        raise EpdctlError(f"cluster {state.name!r} runs {engine}: `check --canary` drives SGLang's "
                          "bootstrap-room contract (SGLang and the embedded engine); vLLM's NIXL "
                          "PD is checked by `epdctl up`'s canary through the router only")
    tokens = check_pairs(workers)
    doc: dict[str, Any] = {"cluster": state.name, "engine": engine,
                           "tokens": [t.to_json() for t in tokens]}
    ok = all(t.ok for t in tokens)
    text = [render_tokens(tokens, state.name)]
    if engine == "embedded":
        from epdctl.pair_canary import run_pair_canary

        report = run_pair_canary(workers, model=state.model)
        doc["pairs"] = report.to_json()["pairs"]
        ok = ok and report.ok
        text.append(render_pairs(report, state.name))
    else:
        encs = [w for w in workers if w.role == "encoder" and w.is_leader]
        if encs and state.router is not None:
            results = _sglang_encoders(state, encs)
            doc["pairs"] = [r.to_json() for r in results]
            ok = ok and all(r.ok for r in results)
            text.append(render_encoders(results))
    doc["ok"] = ok
    click.echo(json.dumps(doc, indent=2) if as_json else "\n\n".join(text))
    if not ok:
        sys.exit(1)


def _sglang_encoders(state: Any, encs: list[Any]) -> list[Any]:
    from epdctl.canary import run_canary
    from epdctl.encoder_canary import check_encoders

    def send(i: int) -> None:
        # fresh images each time (seedless): a cached embedding would not be transferred again
        run_canary(state.router.url, model=state.model, api_key_env=state.api_key_env,
                   n_images=max(2, len(encs)), max_tokens=8)

    return check_encoders(encs, send)


def up_token_check(workers: list[Any], cluster: str) -> str:
    """`up`'s last step: the first prefill->decode pair's tokens against a prefill-only run.
    One line when it passes; ProbeError naming the pair when it does not."""
    from epdctl.commands.canary_view import human_bytes
    from epdctl.errors import ProbeError
    from epdctl.token_canary import check_pairs, role_of

    lead = [w for w in workers if getattr(w, "is_leader", True)]
    first = [next(w for w in lead if role_of(w) == r) for r in ("prefill", "decode")]
    [r] = check_pairs(first)
    if not r.ok:
        raise ProbeError(f"token canary {r.label}: {r.reason}; every pair: "
                         f"`epdctl check --canary {cluster}`")
    kv = "" if r.kv_bytes is None else f", KV {human_bytes(r.kv_bytes)}"
    return (f"  tokens:   {r.label} decoded {len(r.tokens)} tokens equal to a prefill-only run"
            f"{kv}")
