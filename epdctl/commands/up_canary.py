"""The end of `epdctl up`: prove the new cluster answers and that data crossed every hop.

One image request through the router (its answer is only right if embeddings and KV moved),
the transport bytes each worker counted meanwhile (embedded engine), and the first
prefill->decode pair's tokens against a prefill-only run (SGLang and embedded).
"""

from __future__ import annotations

from typing import Any

import click

from epdctl.commands.render_status import render_canary
from epdctl.errors import ProbeError


def run_up_canary(plan: Any, topo: Any, api_key_env: str | None) -> None:
    """Print the canary's lines; ProbeError (saying the cluster still runs) when it fails."""
    from epdctl.canary import run_canary
    from epdctl.commands.canary_view import missing_transfers, render_deltas
    from epdctl.pair_canary import byte_deltas
    from epdctl.token_canary import role_of

    still = (f"the cluster is still running: inspect it with `epdctl status` and `epdctl logs`, "
             f"stop it with `epdctl down {topo.name}`")
    try:
        res, deltas = byte_deltas(plan.workers, lambda: run_canary(
            plan.router.url, model=topo.model.served_name, api_key_env=api_key_env))
    except ProbeError as e:
        raise ProbeError(f"{e}\n{still}") from e
    click.echo(render_canary(res))
    if topo.engine == "embedded":  # other engines' /metrics carry no epd transport counters
        roles = {w.name: role_of(w) for w in plan.workers}
        click.echo(render_deltas(deltas, roles))
        missing = missing_transfers(deltas, roles)
        if missing:
            raise ProbeError(f"canary: {'; '.join(missing)} (answer {res.answer[:80]!r}); "
                             f"per pair: `epdctl check --canary {topo.name}`\n{still}")
    if topo.engine in ("embedded", "sglang") and any(role_of(w) == "decode" for w in plan.workers):
        from epdctl.commands.check_canary import up_token_check

        try:
            click.echo(up_token_check(list(plan.workers), topo.name))
        except ProbeError as e:
            raise ProbeError(f"{e}\n{still}") from e
