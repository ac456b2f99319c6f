"""Cross-role checks on a read topology: placement, parallelism, architectures, KV layout, NICs,
reachability, ports and engine args. Each returns problems as (YAML path, message)."""

from __future__ import annotations

from typing import Iterator

from epdctl.engines.registry import engine_of
from epdctl.topology.container import container_problems
from epdctl.topology.engine_flags import flag_table
from epdctl.topology.model import Role, Topology, Worker
from epdctl.topology.ports import plan_ports
from epdctl.topology.secrets import looks_secret

# SGLang forces ep_size = tp_size with these all-to-all backends (overrides._a2a_ep_size).
EP_EQUALS_TP_A2A = ("deepep", "deepep_v2", "megamoe", "mooncake", "nixl", "mori", "flashinfer", "flashinfer_megamoe")
ROUTER_MANAGED = ("--host", "--port", "--prometheus-host", "--prometheus-port", "--pd-disaggregation", "--prefill",
                  "--decode", "--worker-urls", "--policy")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
def is_loopback(host: str) -> bool:
    return host in LOOPBACK or host.startswith("127.")


def run_checks(topo: Topology) -> list[tuple[str, str]]:
    """Every cross-role problem of ``topo``."""
    out: list[tuple[str, str]] = []
    for check in (_roles, _shared_nodes, _parallelism, _architecture, _kv_layout, _transfer, _nics, _reachability,
                  _args, _router):
        out.extend(check(topo))
    out.extend(plan_ports(topo).problems)
    out.extend(container_problems(topo))
    return out


def _roles(topo: Topology) -> Iterator[tuple[str, str]]:
    have = {w.role for w in topo.workers}
    if Role.COLOCATED in have and have & {Role.ENCODER, Role.PREFILL, Role.DECODE}:
        yield "roles.colocated", "colocated workers cannot be mixed with encoder/prefill/decode in one topology; " \
                                 "write a separate topology for the comparison (see topologies/local-colocated.yaml)"
    if Role.PREFILL in have and Role.DECODE not in have:
        yield "roles.prefill", "prefill workers need decode workers: add roles.decode"
    if Role.DECODE in have and Role.PREFILL not in have:
        yield "roles.decode", "decode workers need prefill workers: add roles.prefill"
    if Role.ENCODER in have and Role.PREFILL not in have:
        yield "roles.encoder", "encoders feed prefill workers: add roles.prefill and roles.decode"


def _shared_nodes(topo: Topology) -> Iterator[tuple[str, str]]:
    owner: dict[str, Worker] = {}
    for w in topo.workers:
        for n in w.nodes:
            first = owner.setdefault(n, w)
            if first.role is not w.role and not topo.node(n).shared:
                yield w.path, (f"node {n!r} is in two roles ({first.role.value} and {w.role.value}); give each role "
                               f"its own nodes, or set shared: true on the node to split its GPUs between roles")
                owner[n] = w  # report each pair once


def _parallelism(topo: Topology) -> Iterator[tuple[str, str]]:
    engine = engine_of(topo)
    for w in topo.workers:
        s = w.settings
        yield from engine.setting_problems(topo, w)
        if engine.single_process and (s.tp, s.pp, s.dp, s.attention_dp) != (1, 1, 1, 1):
            yield w.path, (f"the {engine.name} engine runs one CPU process per worker: tp, pp, dp and attention_dp "
                           "must be 1")
            continue
        if s.tp % s.attention_dp:
            yield w.path, f"tp ({s.tp}) must be a multiple of attention_dp ({s.attention_dp})"
        if s.attention_dp > 1 and s.dp > 1:
            yield w.path, "attention_dp and dp (replicas) cannot both be above 1; use attention_dp for DP attention"
        if s.dp > 1 and len(w.nodes) > 1:
            yield w.path, (f"dp = {s.dp} replicas across {len(w.nodes)} nodes is not supported by SGLang; use "
                           f"attention_dp across nodes, or one worker per node")
        if s.ep is not None and s.tp % s.ep:
            yield w.path, f"ep ({s.ep}) must divide tp ({s.tp})"
        if s.moe_a2a_backend in EP_EQUALS_TP_A2A and s.ep is not None and s.ep != s.tp:
            yield w.path, (f"moe_a2a_backend {s.moe_a2a_backend} forces ep == tp; got ep {s.ep}, tp {s.tp} (set "
                           f"ep: {s.tp} or drop ep, or use moe_a2a_backend: none for ep < tp)")
        if s.chunked_prefill_size and s.chunked_prefill_size > 0 and s.page_size and \
                s.chunked_prefill_size % s.page_size:
            yield w.path, (f"chunked_prefill_size ({s.chunked_prefill_size}) must be a multiple of page_size "
                           f"({s.page_size})")


def _architecture(topo: Topology) -> Iterator[tuple[str, str]]:
    arch = topo.model.architecture
    engine = engine_of(topo)
    supported = engine.epd_architectures
    if supported is None or not topo.has_encoders or arch is None:
        return
    if arch not in supported:
        yield "roles.encoder", (f"{engine.label} {engine.version} does not support encoder disaggregation for {arch} "
                                f"(model.architecture); drop roles.encoder (prefill then encodes images itself) or "
                                f"pick a supported model: {', '.join(supported[:4])}, ...")


def _kv_layout(topo: Topology) -> Iterator[tuple[str, str]]:
    for attr, what in (("page_size", "page size"), ("kv_cache_dtype", "KV cache dtype")):
        pre = {getattr(w.settings, attr) for w in topo.role_workers(Role.PREFILL)}
        dec = {getattr(w.settings, attr) for w in topo.role_workers(Role.DECODE)}
        if pre and dec and (len(pre | dec) > 1):
            show = lambda vals: ", ".join(sorted("engine default" if v is None else str(v) for v in vals))  # noqa: E731
            yield "roles.decode", (f"prefill and decode must use the same {what} for KV transfer: prefill has "
                                   f"{show(pre)}, decode has {show(dec)}; set {attr} once in defaults")


def _transfer(topo: Topology) -> Iterator[tuple[str, str]]:
    yield from engine_of(topo).transfer_problems(topo)


def _nics(topo: Topology) -> Iterator[tuple[str, str]]:
    for w in topo.workers:
        names = w.settings.nics if w.settings.nics is not None else topo.transfer.nics
        src = w.path + ".nics" if w.settings.nics is not None else "transfer.nics"
        for n in w.nodes:
            node = topo.node(n)
            for name in names or ():
                if node.nic(name) is None:
                    have = ", ".join(x.name for x in node.nics) or "none"
                    yield src, (f"NIC {name!r} is not defined on node {n!r} (used by {w.name}); the node has: {have}; "
                                f"add it to nodes[].nics or pick another")


def _advertised(topo: Topology, w: Worker) -> str:
    h = w.settings.host
    return topo.node(w.nodes[0]).host if h in ("0.0.0.0", "::", "node") else h  # "node": its address


def _reachability(topo: Topology) -> Iterator[tuple[str, str]]:
    def check(w: Worker, peer_node: str, who: str) -> Iterator[tuple[str, str]]:
        same_machine = is_loopback(topo.node(w.nodes[0]).host) and is_loopback(topo.node(peer_node).host)
        adv = _advertised(topo, w)
        if peer_node != w.nodes[0] and is_loopback(adv) and not same_machine:
            yield w.path, (f"{w.name} listens on {adv} (loopback) on node {w.nodes[0]!r}, but {who} on "
                           f"node {peer_node!r} must reach it; set host: node (the node's address) or an address "
                           f"for this role (0.0.0.0 only if you mean every interface)")

    prefills = topo.role_workers(Role.PREFILL)
    node_names = {n.name for n in topo.nodes}
    for w in topo.workers:
        peers: list[tuple[str, str]] = []
        if topo.router is not None and w.role is not Role.ENCODER and topo.router.node in node_names:
            peers.append((topo.router.node, "the router"))
        if w.role is Role.ENCODER:
            peers += [(p.nodes[0], p.name) for p in prefills]
        if w.role is Role.PREFILL:
            peers += [(d.nodes[0], d.name) for d in topo.role_workers(Role.DECODE)]
        seen = set()
        for node, who in peers:
            if node in seen:
                continue
            seen.add(node)
            found = list(check(w, node, who))
            yield from found[:1]
            if found:
                break


def _args(topo: Topology) -> Iterator[tuple[str, str]]:
    """Engine args, checked once per place they are written (a role's args at the role's line)."""
    engine = engine_of(topo)
    managed = engine.managed_flags
    reported: set[tuple[str, str]] = set()
    for w in topo.workers:
        table = engine.flags(w.role, w.settings.module)
        for path, tokens in w.settings.args_src:
            if (path, table.version) in reported:
                continue
            reported.add((path, table.version))
            for msg in table.check(tokens):
                yield path, msg + " (args are passed to the engine verbatim)"
            for tok in tokens:
                if not tok.startswith("-"):
                    if looks_secret(tok):
                        yield path, ("inline secret: a value in args looks like a key or token and would be written "
                                     "to plans and logs; pass it as ${NAME} from the launching environment")
                    continue
                name = tok.split("=")[0]
                opt = table.resolve(name)
                spellings = opt.flags if opt is not None else (name,)
                if any(f in ("--api-key", "--admin-api-key") for f in spellings):
                    yield path, (f"inline secret: {name} in args would be written to plans and logs; worker API "
                                 f"keys are not supported yet, protect the router with router.api_key_env instead")
                elif any(f in managed for f in spellings):
                    alias = f" (the engine reads it as {max(spellings, key=len)})" if name not in managed else ""
                    yield path, (f"{name}{alias} is set by epdctl from the topology; use the topology key instead "
                                 f"of args (see docs/topology.md)")
    if topo.router is not None and topo.router.args:
        if topo.router.implementation == "smg":
            for msg in flag_table("smg").check(topo.router.args):
                yield "router.args", msg + " (router args are passed to smg verbatim)"
        for tok in topo.router.args:
            flag = tok.split("=")[0]
            if flag in ("--api-key", "--control-plane-api-keys"):
                yield "router.args", "inline secret: pass the router key with router.api_key_env: NAME"
            elif flag in ROUTER_MANAGED:
                yield "router.args", (f"{flag} is set by epdctl from the topology (router.host, port, prometheus_*, "
                                      f"policy and the worker list); use those keys instead of args")


def _router(topo: Topology) -> Iterator[tuple[str, str]]:
    r = topo.router
    if r is None:
        return
    if r.node not in {n.name for n in topo.nodes}:
        yield "router.node", f"unknown node {r.node!r}; defined nodes: {', '.join(n.name for n in topo.nodes)}"
    if r.implementation == "mini_lb" and not topo.role_workers(Role.PREFILL):
        yield "router.implementation", ("mini_lb only fronts prefill/decode pairs (PD); use smg or sglang-router for "
                                        "colocated workers")
    if r.implementation == "sglang-router" and not topo.role_workers(Role.PREFILL) and \
            not topo.role_workers(Role.COLOCATED):
        yield "router", "the router needs prefill/decode or colocated workers to route to"
