"""The canary commands: `epdctl check --canary [CLUSTER]` and the end of `epdctl up`.

`check --canary` proves every transfer pair of a running cluster.

Why a separate command path: the preflight judges a topology before launch; this one talks to
the recorded workers of a running cluster (resolved as `epdctl status` resolves it). Per engine:

* every engine with SGLang's native API (SGLang, the embedded engine): each prefill->decode
  pair's greedy tokens against a prefill-only run of the same prefix, with the KV bytes the
  prefill counted (``epdctl.canary.tokens``);
* embedded: also image requests on every pair with each worker's transport bytes
  (``epdctl.canary.pairs``), so every encoder->prefill pair is byte-counted;
* SGLang with encoders: each encoder's embedding-transfer count grows under image requests
  through the router (``epdctl.canary.encoders``).
"""

from __future__ import annotations

import json
from typing import Any

import click

from epdctl.engines import engine_for, engine_of
from epdctl.canary.view import render_encoders, render_pairs, render_tokens
from epdctl.commands.args import cluster_arg
from epdctl.commands.render_status import render_canary
from epdctl.errors import EpdctlError, ProbeError, Reported
from epdctl.state.store import resolve_cluster
from epdctl.topology.model import Topology
from epdctl.render.plan import Plan


def check_canary(cluster: str | None, as_json: bool) -> None:
    from epdctl.canary.tokens import check_pairs

    cdir = resolve_cluster(cluster_arg(cluster))
    state = cdir.load()
    if state is None:
        raise EpdctlError(f"cluster {cdir.name!r} is not running (nothing recorded); start it "
                          "with `epdctl up TOPOLOGY`")
    workers = state.workers
    engine = state.engine
    canary = engine_for(engine).canary
    if not canary.token_check:
        raise EpdctlError(f"cluster {state.name!r} runs {engine}: `check --canary` drives SGLang's "
                          "bootstrap-room contract (SGLang and the embedded engine); vLLM's NIXL "
                          "PD is checked by `epdctl up`'s canary through the router only")
    tokens = check_pairs(workers, api_key_env=state.api_key_env)
    doc: dict[str, Any] = {"cluster": state.name, "engine": engine,
                           "tokens": [t.to_json() for t in tokens]}
    ok = all(t.ok for t in tokens)
    text = [render_tokens(tokens, state.name)]
    if canary.pairs:
        from epdctl.canary.pairs import run_pair_canary

        report = run_pair_canary(workers, model=state.model, api_key_env=state.api_key_env)
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
        raise Reported()


def _sglang_encoders(state: Any, encs: list[Any]) -> list[Any]:
    from epdctl.canary.request import run_canary
    from epdctl.canary.encoders import check_encoders

    def send(i: int) -> None:
        # fresh images each time (seedless): a cached embedding would not be transferred again
        run_canary(state.router.url, model=state.model, api_key_env=state.api_key_env,
                   n_images=max(2, len(encs)), max_tokens=8)

    return check_encoders(encs, send, api_key_env=state.api_key_env)


def up_token_check(workers: list[Any], cluster: str, api_key_env: str | None) -> str:
    """`up`'s last step: the first prefill->decode pair's tokens against a prefill-only run.
    One line when it passes; ProbeError naming the pair when it does not."""
    from epdctl.canary.view import human_bytes
    from epdctl.canary.tokens import check_pairs, role_of

    lead = [w for w in workers if getattr(w, "is_leader", True)]
    first = [next(w for w in lead if role_of(w) == r) for r in ("prefill", "decode")]
    [r] = check_pairs(first, api_key_env=api_key_env)
    if not r.ok:
        raise ProbeError(f"token canary {r.label}: {r.reason}; every pair: "
                         f"`epdctl check --canary {cluster}`")
    kv = "" if r.kv_bytes is None else f", KV {human_bytes(r.kv_bytes)}"
    return (f"  tokens:   {r.label} decoded {len(r.tokens)} tokens equal to a prefill-only run"
            f"{kv}")


def run_up_canary(plan: Plan, topo: Topology, api_key_env: str | None) -> None:
    """Print the canary's lines; ProbeError (saying the cluster still runs) when it fails."""
    from epdctl.canary.pairs import byte_deltas
    from epdctl.canary.request import run_canary
    from epdctl.canary.tokens import role_of
    from epdctl.canary.view import missing_transfers, render_deltas

    still = (f"the cluster is still running: inspect it with `epdctl status` and `epdctl logs`, "
             f"stop it with `epdctl down {topo.name}`")
    router = plan.router
    if router is None:
        raise ProbeError(f"{topo.name} has no router to send the canary through")
    canary = engine_of(topo).canary
    if canary.connectors and plan.stores:
        return _connector_canary(plan, router.url, topo, api_key_env, still)
    try:
        res, deltas = byte_deltas(plan.workers, lambda: run_canary(
            router.url, model=topo.model.served_name, api_key_env=api_key_env, distinct_colours=True),
            api_key_env=api_key_env)
    except ProbeError as e:
        raise ProbeError(f"{e}\n{still}") from e
    click.echo(render_canary(res))
    if canary.transfer_counters:  # other engines' /metrics carry no epd transport counters
        roles = {w.name: role_of(w) for w in plan.workers}
        click.echo(render_deltas(deltas, roles))
        missing = missing_transfers(deltas, roles)
        if missing:
            raise ProbeError(f"canary: {'; '.join(missing)} (answer {res.answer[:80]!r}); "
                             f"per pair: `epdctl check --canary {topo.name}`\n{still}")
    if canary.token_check and any(role_of(w) == "decode" for w in plan.workers):
        try:
            click.echo(up_token_check(list(plan.workers), topo.name, api_key_env))
        except ProbeError as e:
            raise ProbeError(f"{e}\n{still}") from e


def _connector_canary(plan: Plan, router_url: str, topo: Topology, api_key_env: str | None, still: str) -> None:
    """vLLM through files: the answer, and the KV tokens and store bytes the request moved."""
    from epdctl.canary.connectors import prove
    from epdctl.canary.request import run_canary

    dirs = sorted({d for ds in plan.stores.values() for d in ds})
    try:
        res, proof = prove(plan.workers, dirs, lambda: run_canary(
            router_url, model=topo.model.served_name, api_key_env=api_key_env, distinct_colours=True),
            api_key_env=api_key_env)
    except ProbeError as e:
        raise ProbeError(f"{e}\n{still}") from e
    click.echo(render_canary(res))
    for line in proof.lines():
        click.echo(line)
    missing = proof.missing()
    if missing:
        raise ProbeError(f"canary: {'; '.join(missing)} (answer {res.answer[:80]!r})\n{still}")
