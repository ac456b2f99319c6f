"""Pure rebalance planning: requested role deltas -> ordered moves, new topology, new commands.

Why pure: a rebalance is checked completely (last worker of a role, multi-node units, GPUs,
ports, the topology checks) before anything is drained, and `--dry-run` shows exactly what would
run. Every existing worker keeps its ports (they are pinned), so only the moved worker's command
changes, plus the prefills' rendered ``--encoder-urls`` (applied live through their registries).
"""

from __future__ import annotations

import dataclasses
import difflib
import shlex
from dataclasses import dataclass
from typing import Any, Mapping

from epdctl.engines import engine_of
from epdctl.errors import RenderError, TopologyError
from epdctl.render import build_plan
from epdctl.render.plan import Plan
from epdctl.topology.checks import run_checks
from epdctl.topology.model import Role, Topology, Worker
from epdctl.topology.ports import plan_ports

MOVABLE = (Role.ENCODER, Role.PREFILL, Role.DECODE)


class RebalanceError(TopologyError):
    """The requested rebalance cannot be planned (reported before anything moves)."""


@dataclass(frozen=True)
class Move:
    """One worker changing role. Ports are fixed at plan time so a replay is exact."""

    worker: str                  # name before the move, e.g. "decode-1"
    old_role: str
    new_role: str
    new_name: str                # e.g. "encoder-1"
    nodes: tuple[str, ...]
    port: int
    bootstrap_port: int | None = None
    encoder_bootstrap_port: int | None = None
    dist_init_port: int | None = None
    path: str = "restart"        # "in-place" (model stays loaded) | "restart"
    why: str = ""                # how, or why not in place

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "nodes": list(self.nodes)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Move":
        known = {f.name for f in dataclasses.fields(cls)}
        vals = {k: v for k, v in d.items() if k in known}
        vals["nodes"] = tuple(vals.get("nodes") or ())
        return cls(**vals)


@dataclass(frozen=True)
class RebalancePlan:
    """What a rebalance will do: moves in order, and the layouts/commands before and after."""

    moves: tuple[Move, ...]
    before: Topology
    after: Topology
    plan_before: Plan
    plan_after: Plan


def parse_delta(text: str | int | None, flag: str) -> int:
    """'+2', '-1', '2' -> int; RebalanceError naming the flag otherwise."""
    if text is None:
        return 0
    if isinstance(text, int):
        return text
    try:
        return int(str(text).strip())
    except ValueError:
        raise RebalanceError(f"{flag} {text!r} is not a count; write it like +2 or -1") from None


def role_counts(topo: Topology) -> dict[str, int]:
    """Workers per movable role."""
    return {r.value: len(topo.role_workers(r)) for r in MOVABLE}


def pin_ports(topo: Topology) -> Topology:
    """A copy where every worker's and the router's rank-0 ports are explicit (stay put)."""
    ports = plan_ports(topo)
    if ports.problems:
        raise RebalanceError("; ".join(f"{p}: {m}" for p, m in ports.problems))
    workers = []
    for w in topo.workers:
        p = ports.workers[(w.name, 0)]
        workers.append(dataclasses.replace(
            w, port=p["http"], bootstrap_port=p.get("bootstrap"),
            encoder_bootstrap_port=p.get("encoder_bootstrap"), dist_init_port=p.get("dist_init"),
            transfer_port=p.get("transfer")))
    router = topo.router
    if router is not None and ports.router:
        router = dataclasses.replace(router, port=ports.router["http"],
                                     prometheus_port=ports.router["prometheus"])
    return dataclasses.replace(topo, workers=tuple(workers), router=router)


def _order(workers: list[Worker]) -> tuple[Worker, ...]:
    rank = {r: i for i, r in enumerate(Role)}
    return tuple(sorted(workers, key=lambda w: (rank[w.role], w.index)))


def _template(topo: Topology, role: Role, moving: Worker) -> Worker:
    peers = [w for w in topo.role_workers(role) if w.name != moving.name]
    if not peers:
        raise RebalanceError(f"the topology has no {role.value} worker to copy settings from; "
                             f"add one to the topology file and `epdctl up` again")
    return peers[0]


def _moved_worker(topo: Topology, src: Worker, role: Role) -> Worker:
    """``src`` re-cast in ``role``: the role's settings, ``src``'s nodes and GPUs."""
    tpl = _template(topo, role, src)
    if len(tpl.nodes) != len(src.nodes):
        raise RebalanceError(
            f"{src.name} spans {len(src.nodes)} node(s) but a {role.value} worker needs "
            f"{len(tpl.nodes)}: multi-node workers move as a unit; pick another source role")
    engine = engine_of(topo)
    if engine.uses_gpus and tpl.gpus_per_node > src.gpus_per_node:
        raise RebalanceError(
            f"{src.name} has {src.gpus_per_node} GPU(s) per node but a {role.value} worker needs "
            f"{tpl.gpus_per_node}: it does not fit")
    index = max((w.index for w in topo.role_workers(role)), default=-1) + 1
    # an SGLang role-switch instance keeps its bootstrap server (and port) in both roles
    keeps = engine.switch is not None and engine.switch.keeps_bootstrap and engine.switchable(topo, src)
    keep = src.bootstrap_port if keeps else None
    return Worker(role=role, index=index, nodes=src.nodes, settings=tpl.settings,
                  path=f"roles.{role.value} (rebalanced from {src.name})",
                  base_gpu_ids=src.base_gpu_ids, gpu_ids=src.gpu_ids, port=src.port, bootstrap_port=keep,
                  transfer_port=src.transfer_port,
                  dist_init_port=src.dist_init_port if len(src.nodes) > 1 else None)


def _swap(topo: Topology, src: Worker, new: Worker) -> Topology:
    others = [w for w in topo.workers if w.name != src.name]
    return dataclasses.replace(topo, workers=_order([*others, new]))


def _validate(topo: Topology, what: str) -> Plan:
    problems = run_checks(topo)
    if problems:
        raise RebalanceError(f"{what} would not validate:\n" +
                             "\n".join(f"  {p}: {m}" for p, m in problems))
    try:
        return build_plan(topo)
    except RenderError as e:
        raise RebalanceError(f"{what} cannot be rendered: {e}") from e


def apply_move(topo: Topology, move: Move) -> Topology:
    """The topology after ``move`` (replay of a recorded move; ports exactly as recorded)."""
    topo = pin_ports(topo)
    src = next((w for w in topo.workers if w.name == move.worker), None)
    if src is None or src.role.value != move.old_role:
        raise RebalanceError(f"recorded move {move.worker} -> {move.new_name} does not match the "
                             f"topology (no {move.old_role} worker {move.worker})")
    new = _moved_worker(topo, src, Role(move.new_role))
    new = dataclasses.replace(new, index=int(move.new_name.rsplit("-", 1)[1]),
                              bootstrap_port=move.bootstrap_port,
                              encoder_bootstrap_port=move.encoder_bootstrap_port)
    return _swap(topo, src, new)


def replay(topo: Topology, moves: list[Move]) -> Topology:
    """The current layout: the topology file plus every move applied so far."""
    for m in moves:
        topo = apply_move(topo, m)
    return topo


def _wanted(deltas: Mapping[str, int], source: str | None, counts: dict[str, int]
            ) -> tuple[list[str], list[str]]:
    """(targets, sources) as role names, one entry per moving worker."""
    for role in deltas:
        if role not in counts:
            raise RebalanceError(f"unknown role {role!r}; use encoder, prefill or decode")
    gains = [r for r, d in deltas.items() if d > 0 for _ in range(d)]
    losses = [r for r, d in deltas.items() if d < 0 for _ in range(-d)]
    if source is not None:
        if source not in counts:
            raise RebalanceError(f"--from {source!r}: use encoder, prefill or decode")
        if deltas.get(source, 0) > 0:
            raise RebalanceError(f"--from {source} but {source} is also asked to grow")
        losses += [source] * (len(gains) - len(losses))
    if not gains and not losses:
        raise RebalanceError("nothing to do: give a change such as --encoder +1 --from decode")
    if len(gains) != len(losses):
        raise RebalanceError(
            f"the node pool is fixed: {len(gains)} worker(s) to add but {len(losses)} to take; "
            f"balance the counts (e.g. --encoder +1 --decode -1) or name a source with --from")
    for role in set(losses):
        left = counts[role] - losses.count(role)
        if left < 1:
            raise RebalanceError(f"refusing to take every {role} worker ({counts[role]} now, "
                                 f"{losses.count(role)} asked): a role must keep at least one")
    return gains, losses


def plan_rebalance(topo: Topology, deltas: Mapping[str, int], source: str | None = None
                   ) -> RebalancePlan:
    """Check and plan the whole rebalance; RebalanceError before anything moves."""
    if topo.role_workers(Role.COLOCATED):
        raise RebalanceError("a colocated topology has no roles to rebalance")
    before = pin_ports(topo)
    plan_before = _validate(before, "the current layout")
    gains, losses = _wanted({k: v for k, v in deltas.items() if v}, source, role_counts(topo))
    cur, moves = before, []
    for target, src_role in zip(gains, losses):
        move, cur = _one_move(cur, Role(src_role), Role(target))
        moves.append(move)
    plan_after = _validate(cur, "the new layout")
    return RebalancePlan(tuple(moves), before, cur, plan_before, plan_after)


def _one_move(topo: Topology, src_role: Role, target: Role) -> tuple[Move, Topology]:
    """Move the last worker of ``src_role`` whose departure leaves a valid layout."""
    errors: list[str] = []
    for src in reversed(topo.role_workers(src_role)):
        try:
            new = _moved_worker(topo, src, target)
            after = pin_ports(_swap(topo, src, new))  # allocates the new role's extra ports
            plan = _validate(after, f"moving {src.name} to {target.value}")
        except RebalanceError as e:
            errors.append(str(e))
            continue
        spec = next(w for w in plan.workers if w.name == new.name)
        moved = next(w for w in after.workers if w.name == new.name)
        path, why = engine_of(topo).move_path(topo, src, target)
        return Move(worker=src.name, old_role=src_role.value, new_role=target.value,
                    new_name=new.name, nodes=src.nodes, port=spec.port,
                    bootstrap_port=spec.bootstrap_port,
                    encoder_bootstrap_port=spec.encoder_bootstrap_port,
                    dist_init_port=moved.dist_init_port, path=path, why=why), after
    raise RebalanceError(f"no {src_role.value} worker can become {target.value}:\n" +
                         "\n".join(errors))


def force_restart(rp: RebalancePlan) -> RebalancePlan:
    """The same plan with every move restarting its worker (``rebalance --restart``)."""
    moves = tuple(dataclasses.replace(m, path="restart", why="--restart asked for it") for m in rp.moves)
    return dataclasses.replace(rp, moves=moves)


def topology_diff(rp: RebalancePlan) -> list[str]:
    """Role map before/after, one line per worker, as a unified diff."""
    def lines(t: Topology) -> list[str]:
        return [f"{w.name:<12} role={w.role.value:<8} nodes={','.join(w.nodes)} port={w.port}"
                for w in t.workers]
    counts = lambda t: " ".join(f"{r}={n}" for r, n in role_counts(t).items())  # noqa: E731
    head = [f"--- layout now   ({counts(rp.before)})", f"+++ layout after ({counts(rp.after)})"]
    return head + list(difflib.unified_diff(lines(rp.before), lines(rp.after), lineterm="",
                                            n=99))[2:]


def commands_diff(rp: RebalancePlan) -> list[str]:
    """Rendered commands before/after (only the lines that change, with one line of context)."""
    def lines(p: Plan) -> list[str]:
        return [f"[{w.node}/{w.name}] {shlex.join(w.argv)}" for w in p.workers]
    return list(difflib.unified_diff(lines(rp.plan_before), lines(rp.plan_after),
                                     "commands now", "commands after", lineterm="", n=0))
