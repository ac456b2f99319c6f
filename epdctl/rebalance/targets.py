"""Where a move's workers are in a rendered plan: their ranks, the prefills' encoder registries,
and the ports a move adds (checked free before anything moves)."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from epdctl.errors import LaunchError
from epdctl.rebalance.plan import RebalancePlan
from epdctl.render.plan import Plan, ProcessSpec
from epdctl.state.store import worker_of


def extra_ports_free(rp: RebalancePlan) -> None:
    """Before anything moves: the ports a move adds (a new prefill's bootstrap ports) are free.

    The HTTP port is not checked: the worker's old role still holds it until the stop."""
    busy = []
    for m in rp.moves:
        spec = worker_specs(rp.plan_after, m.new_name)[0] if any(
            w.name == m.new_name for w in rp.plan_after.workers) else None
        for port in (m.bootstrap_port, m.encoder_bootstrap_port):
            if port is None:
                continue
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((spec.host if spec else "127.0.0.1", int(port)))
                except OSError:
                    busy.append(f"{m.new_name} port {port}")
    if busy:
        raise LaunchError(f"ports the new layout needs are taken: {', '.join(busy)}; free them "
                          "or change ports.base in the topology, then plan again")


def worker_specs(plan: Plan, worker: str) -> list[ProcessSpec]:
    specs = [w for w in plan.workers if worker_of(w.name) == worker]
    if not specs:
        raise LaunchError(f"worker {worker} is not in the rendered plan")
    return sorted(specs, key=lambda w: w.node_rank)


def encoder_registries(plan: Plan, exclude: str) -> list[str]:
    """Every prefill leader's encoder registry (its encoder-bootstrap port, else its HTTP port)."""
    out = []
    for w in plan.workers:
        if w.role != "prefill" or not w.is_leader or w.name == exclude:
            continue
        if w.encoder_bootstrap_port:
            host = urlsplit(w.url).hostname or w.host
            host = f"[{host}]" if ":" in host else host
            out.append(f"http://{host}:{w.encoder_bootstrap_port}")
        else:
            out.append(w.url)
    return out
