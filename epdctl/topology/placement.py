"""Roles -> workers on nodes: spread ``count`` workers over a role's nodes, or take the explicit
``workers`` list; give every worker its GPU slots (base GPU id per node) and check the budget."""

from __future__ import annotations

from typing import Any

from epdctl.topology.loader import join
from epdctl.topology.model import ROLE_ORDER, Node, Role, Settings, Worker
from epdctl.topology.reader import Reader
from epdctl.topology.schema import MAX_COUNT, MAX_GPUS_PER_NODE, ROLE_KEYS, SETTING_KEYS, WORKER_KEYS, merge_settings, read_settings


MAX_GPU_ID = MAX_GPUS_PER_NODE - 1


def read_roles(r: Reader, top: dict[str, Any], nodes: dict[str, Node], node_layers: dict[str, dict[str, Any]],
               defaults: dict[str, Any], uses_gpus: bool,
               counted: dict[str, tuple[str, ...]] | None = None) -> tuple[Worker, ...]:
    """Every worker of every role, in start order; ``counted``: role -> nodes synthesized from its count."""
    raw = top.get("roles")
    if raw is None:
        r.problem("", "missing required key 'roles' (encoder/prefill/decode, or colocated)")
        return ()
    roles = r.mapping(raw, "roles", [x.value for x in ROLE_ORDER], "roles")
    if roles is None:
        return ()
    workers: list[Worker] = []
    for role in ROLE_ORDER:
        if roles.get(role.value) is None:
            continue
        path = f"roles.{role.value}"
        m = r.mapping(roles[role.value], path, ROLE_KEYS, f"role {role.value}")
        if m is not None:
            workers.extend(_role_workers(r, role, m, path, nodes, node_layers, defaults, uses_gpus,
                                         (counted or {}).get(role.value)))
    rejected = any(isinstance(v, dict) and _is_count(v.get("nodes")) and role not in (counted or {})
                   for role, v in roles.items())  # already reported at roles.<role>.nodes
    explained = any(p.path.startswith("roles.") for p in r.problems)  # a role's own problem already says why
    if not workers and not rejected and not explained:
        r.problem("roles", "no workers: define roles.prefill and roles.decode (plus roles.encoder for images), "
                           "or roles.colocated")
    _assign_gpus(r, workers, nodes, uses_gpus)
    return tuple(workers)


def _node_list(r: Reader, m: dict[str, Any], path: str, key: str, nodes: dict[str, Node]) -> list[str] | None:
    names = r.get(m, path, key, "strlist") if key == "nodes" else (
        (r.get(m, path, key, "str"),) if m.get(key) is not None else None)
    if names is None or None in names:
        return None
    ok = True
    for i, name in enumerate(names):
        if name not in nodes:
            where = join(join(path, key), i) if key == "nodes" else join(path, key)
            r.problem(where, f"unknown node {name!r}; defined nodes: {', '.join(nodes) or '(none)'}")
            ok = False
    if key == "nodes" and len(set(names)) != len(names):
        r.problem(join(path, key), "a node is listed twice; list each node once")
        ok = False
    return list(names) if ok else None


def _role_workers(r: Reader, role: Role, m: dict[str, Any], path: str, nodes: dict[str, Node],
                  node_layers: dict[str, dict[str, Any]], defaults: dict[str, Any],
                  uses_gpus: bool, counted: tuple[str, ...] | None) -> list[Worker]:
    role_layer = read_settings(r, m, path, SETTING_KEYS)
    if counted is not None:
        role_nodes: list[str] | None = list(counted)
    elif _is_count(m.get("nodes")):
        return []  # a node count the allocation reader already rejected (wrong launcher, out of range)
    else:
        role_nodes = _node_list(r, m, path, "nodes", nodes) if m.get("nodes") is not None else None
    count = r.get(m, path, "count", "int", minimum=0, maximum=MAX_COUNT)
    explicit = m.get("workers")
    if count is None and explicit is None and role_nodes and counted is not None:
        count = _workers_filling(role_nodes, nodes, merge_settings(defaults, role_layer), uses_gpus)
    if count is not None and explicit is not None:
        r.problem(join(path, "count"), "give either count (spread over the role's nodes) or a workers list, not both")
        return []
    out: list[Worker] = []
    if explicit is not None:
        if not isinstance(explicit, list):
            r.problem(join(path, "workers"), "workers must be a list of mappings (- node: n0, tp: 4)")
            return []
        for i, item in enumerate(explicit):
            wpath = join(join(path, "workers"), i)
            w = r.mapping(item, wpath, WORKER_KEYS, "a worker")
            if w is None:
                continue
            worker = _explicit_worker(r, role, len(out), w, wpath, role_nodes, nodes, node_layers, defaults,
                                      role_layer, uses_gpus)
            if worker is not None:
                out.append(worker)
        return out
    if count is None:
        r.problem(path, f"role {role.value} needs count (with nodes) or a workers list")
        return []
    if not role_nodes:
        if m.get("nodes") is None:
            r.problem(path, f"role {role.value} has count but no nodes: list the nodes to spread it over")
        return []
    base = merge_settings(defaults, role_layer)
    g = base.gpus if uses_gpus else 0
    gpus = [nodes[n].gpus for n in role_nodes]
    if g == 0 or all(x >= g for x in gpus):
        groups = [[role_nodes[i % len(role_nodes)]] for i in range(count)]
    else:
        per = gpus[0]
        if per == 0 or any(x != per for x in gpus) or g % per:
            r.problem(path, f"each {role.value} worker needs tp*pp*dp = {g} GPUs, more than one node has; a worker "
                            f"spanning nodes must fill whole nodes of equal size (nodes have {sorted(set(gpus))} "
                            f"GPUs); fix tp/pp or list workers explicitly")
            return []
        k = g // per
        if count * k > len(role_nodes):
            r.problem(join(path, "count"), f"{count} {role.value} worker(s) of {k} nodes each need {count * k} nodes, "
                                           f"but roles.{role.value}.nodes lists {len(role_nodes)}")
            return []
        groups = [role_nodes[i * k:(i + 1) * k] for i in range(count)]
    for i, group in enumerate(groups):
        settings = merge_settings(defaults, role_layer, node_layers.get(group[0], {}))
        out.append(Worker(role=role, index=i, nodes=tuple(group), settings=settings, path=path))
    return out


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _workers_filling(role_nodes: list[str], nodes: dict[str, Node], base: Settings, uses_gpus: bool) -> int:
    """Default count for ``nodes: N`` without count: as many workers as fill the N nodes (at least one)."""
    g = base.gpus if uses_gpus else 0
    per = nodes[role_nodes[0]].gpus
    if g == 0 or per == 0 or g <= per:
        return len(role_nodes)
    return max(1, len(role_nodes) // -(-g // per))


def _explicit_worker(r: Reader, role: Role, index: int, w: dict[str, Any], wpath: str, role_nodes: list[str] | None,
                     nodes: dict[str, Node], node_layers: dict[str, dict[str, Any]], defaults: dict[str, Any],
                     role_layer: dict[str, Any], uses_gpus: bool) -> Worker | None:
    if w.get("node") is not None and w.get("nodes") is not None:
        r.problem(wpath, "give node (one machine) or nodes (a multi-node worker), not both")
        return None
    if w.get("nodes") is not None:
        names = _node_list(r, w, wpath, "nodes", nodes)
    elif w.get("node") is not None:
        names = _node_list(r, w, wpath, "node", nodes)
    elif role_nodes and len(role_nodes) == 1:
        names = list(role_nodes)
    else:
        r.problem(wpath, "missing required key 'node' (or 'nodes' for a worker spanning several machines)")
        return None
    if not names:
        return None
    settings = merge_settings(defaults, role_layer, node_layers.get(names[0], {}),
                              read_settings(r, w, wpath, SETTING_KEYS))
    ports = {k: r.get(w, wpath, k, "int", minimum=1, maximum=65535)
             for k in ("port", "bootstrap_port", "encoder_bootstrap_port", "dist_init_port",
                       "transfer_port")}
    worker = Worker(role=role, index=index, nodes=tuple(names), settings=settings, path=wpath, **ports,
                    **_explicit_gpus(r, w, wpath, settings), own_env=r.env(w, wpath) if "env" in w else {})
    g = settings.gpus if uses_gpus else 0
    if len(names) > 1:
        per_node = [nodes[n].gpus for n in names]
        if g == 0 or g % len(names) or any(g // len(names) > x for x in per_node):
            what = f"tp*pp*dp = {settings.tp}*{settings.pp}*{settings.dp} = {g} GPUs"
            r.problem(join(wpath, "nodes"), f"{what} does not match this {len(names)}-node worker (nodes have "
                                            f"{per_node} GPUs); tp*pp*dp must be a multiple of the node count and "
                                            f"fit each node, e.g. tp*pp = {len(names) * max(per_node)}")
            return None
    elif g > nodes[names[0]].gpus:
        r.problem(wpath, f"needs tp*pp*dp = {g} GPUs but node {names[0]!r} has {nodes[names[0]].gpus}; lower tp/pp or "
                         f"spread the worker over several nodes with nodes: [...]")
        return None
    return worker


def _explicit_gpus(r: Reader, w: dict[str, Any], wpath: str, settings: Settings) -> dict[str, Any]:
    """``base_gpu_id`` (first GPU, as --base-gpu-id) or ``gpu_ids`` (CUDA_VISIBLE_DEVICES) of one worker."""
    base = r.get(w, wpath, "base_gpu_id", "int", minimum=0, maximum=MAX_GPU_ID)
    ids: tuple[int, ...] = ()
    raw = w.get("gpu_ids")
    if raw is not None:
        if not isinstance(raw, list) or not raw or not all(isinstance(x, int) and not isinstance(x, bool)
                                                           and 0 <= x <= MAX_GPU_ID for x in raw):
            r.problem(join(wpath, "gpu_ids"), "gpu_ids must be a list of GPU indices, e.g. [4, 5, 6, 7]")
        elif len(set(raw)) != len(raw):
            r.problem(join(wpath, "gpu_ids"), "gpu_ids lists a GPU twice")
        elif len(raw) != settings.gpus // max(1, len(w.get("nodes") or [1])):
            r.problem(join(wpath, "gpu_ids"), f"gpu_ids lists {len(raw)} GPU(s) but the worker uses "
                                              f"{settings.gpus // max(1, len(w.get('nodes') or [1]))} per node "
                                              f"(tp*pp*dp / nodes)")
        else:
            ids = tuple(raw)
    if base is not None and ids:
        r.problem(wpath, "give base_gpu_id or gpu_ids, not both")
        return {}
    return {"base_gpu_id": base, "gpu_ids": ids}


def _assign_gpus(r: Reader, workers: list[Worker], nodes: dict[str, Node], uses_gpus: bool) -> None:
    """Give each worker GPUs on each of its nodes: explicit ones (base_gpu_id, gpu_ids) first, then the
    lowest free consecutive block in start order; report overlaps and nodes whose GPUs run out."""
    used: dict[str, list[tuple[str, int, str]]] = {}
    taken: dict[str, dict[int, str]] = {}  # node -> GPU id -> worker
    bases: dict[str, list[int]] = {}

    def claim(w: Worker, n: str, ids: range | tuple[int, ...]) -> None:
        for g in ids:
            other = taken.setdefault(n, {}).get(g)
            if other is not None and other != w.name:
                r.problem(w.path, f"GPU {g} on node {n!r} is given to both {other} and {w.name}; change "
                                  f"base_gpu_id/gpu_ids")
                return
        for g in ids:
            taken[n][g] = w.name

    explicit = [w for w in workers if w.base_gpu_id is not None or w.gpu_ids]
    for w in explicit + [w for w in workers if w not in explicit]:
        per = w.settings.gpus // len(w.nodes) if uses_gpus else 0
        bases[w.name] = []
        for n in w.nodes:
            slots = used.setdefault(n, [])
            if per:
                slots.append((w.name, per, w.path))
            if w.gpu_ids:
                claim(w, n, w.gpu_ids)
                bases[w.name].append(0)  # CUDA_VISIBLE_DEVICES renumbers the listed GPUs from 0
            elif w.base_gpu_id is not None:
                claim(w, n, range(w.base_gpu_id, w.base_gpu_id + per))
                bases[w.name].append(w.base_gpu_id)
            else:
                free = taken.setdefault(n, {})
                base = 0
                while any(g in free for g in range(base, base + per)):
                    base += 1
                claim(w, n, range(base, base + per))
                bases[w.name].append(base)
    for w in workers:
        object.__setattr__(w, "base_gpu_ids", tuple(bases[w.name]))
    for name, slots in used.items():
        total = sum(x[1] for x in slots)
        top = max(taken.get(name, {}), default=-1) + 1
        if (total > nodes[name].gpus or top > nodes[name].gpus) and slots:
            who = ", ".join(f"{n} ({g})" for n, g, _ in slots)
            need = f"need {total}" if total > nodes[name].gpus else f"use GPU ids up to {top - 1}"
            r.problem(slots[-1][2], f"node {name!r} has {nodes[name].gpus} GPUs but its workers {need}: {who}; "
                                    f"lower count/tp or add nodes")
