"""The transfer-link matrix: which node pairs must move data, measured before launch.

Pairs come from the placement, not from "every node to every node": encoder -> prefill
(embeddings), prefill -> decode (KV cache) and neighbouring node ranks of one multi-node worker
(pipeline / tensor traffic). Each pair is measured per NIC rail with the transport the topology
names, by the agent on the nodes themselves; a pair passes when its bandwidth reaches
``threshold`` x the slower NIC's declared line rate (80 % by default; ngc_multinode_perf uses
90 % for raw RDMA). Pairs that share no node run at the same time; pairs sharing a node are
serialized so that they do not share (and under-report) the node's NIC.
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from epdctl.preflight.runners import NodeRunner, Spawned

log = logging.getLogger(__name__)

AGENT = ("-m", "epdctl.node.preflight_agent")
DEFAULT_THRESHOLD = 0.8
DEFAULT_AGENT_PORT = 36900
_KIND_ORDER = ("embeddings", "kv", "pp")


@dataclass(frozen=True)
class Placement:
    """One process of the plan: which role runs on which node (and its rank there)."""

    worker: str
    role: str
    node: str
    node_rank: int = 0


@dataclass(frozen=True)
class Endpoint:
    """Where a node sends/receives transfer traffic: a declared NIC, or the node's host."""

    node: str
    nic: str
    kind: str
    ip: str
    speed_gbps: float | None = None


@dataclass(frozen=True)
class LinkPair:
    src: Endpoint
    dst: Endpoint
    kinds: tuple[str, ...]          # embeddings | kv | pp
    rail: int = 0

    @property
    def label(self) -> str:
        return f"{self.src.node}->{self.dst.node}"


@dataclass(frozen=True)
class LinkResult:
    pair: LinkPair
    ok: bool
    gbps: float | None
    rtt_ms: float | None
    line_gbps: float | None
    reason: str | None

    def to_json(self) -> dict[str, Any]:
        p = self.pair
        return {"src": p.src.node, "dst": p.dst.node, "kinds": list(p.kinds), "rail": p.rail,
                "src_nic": p.src.nic, "dst_nic": p.dst.nic, "src_ip": p.src.ip,
                "dst_ip": p.dst.ip, "ok": self.ok, "gbps": self.gbps, "rtt_ms": self.rtt_ms,
                "line_gbps": self.line_gbps, "reason": self.reason}


def node_pairs(placements: Sequence[Placement]) -> dict[tuple[str, str], tuple[str, ...]]:
    """Directed node pairs that carry data, with what they carry (same-node pairs dropped)."""
    by_role: dict[str, list[Placement]] = {}
    for p in placements:
        by_role.setdefault(p.role, []).append(p)
    kinds: dict[tuple[str, str], set[str]] = {}

    def add(a: str, b: str, kind: str) -> None:
        if a != b:
            kinds.setdefault((a, b), set()).add(kind)

    for e in by_role.get("encoder", []):
        for p in by_role.get("prefill", []):
            add(e.node, p.node, "embeddings")
    for p in by_role.get("prefill", []):
        for d in by_role.get("decode", []):
            add(p.node, d.node, "kv")
    ranks: dict[str, dict[int, str]] = {}
    for p in placements:
        ranks.setdefault(p.worker, {})[p.node_rank] = p.node
    for per in ranks.values():
        order = [per[r] for r in sorted(per)]
        for a, b in zip(order, order[1:]):
            add(a, b, "pp")
    return {k: tuple(x for x in _KIND_ORDER if x in v) for k, v in kinds.items()}


def link_pairs(placements: Sequence[Placement],
               endpoints: Mapping[str, Sequence[Endpoint]]) -> list[LinkPair]:
    """Node pairs expanded to NIC rails: rail i pairs the i-th endpoint of each side."""
    out: list[LinkPair] = []
    for (a, b), kinds in sorted(node_pairs(placements).items()):
        sa, sb = endpoints[a], endpoints[b]
        for rail in range(max(len(sa), len(sb))):
            out.append(LinkPair(sa[rail % len(sa)], sb[rail % len(sb)], kinds, rail))
    return out


def rounds(pairs: Sequence[LinkPair]) -> list[list[LinkPair]]:
    """Greedy schedule: each round holds pairs with no node in common, in input order."""
    left = list(pairs)
    out: list[list[LinkPair]] = []
    while left:
        busy: set[str] = set()
        this, rest = [], []
        for p in left:
            if p.src.node in busy or p.dst.node in busy:
                rest.append(p)
            else:
                busy.update((p.src.node, p.dst.node))
                this.append(p)
        out.append(this)
        left = rest
    return out


def evaluate(pair: LinkPair, report: Mapping[str, Any], threshold: float) -> LinkResult:
    """Judge one agent report against the slower NIC's declared line rate."""
    speeds = [s for s in (pair.src.speed_gbps, pair.dst.speed_gbps) if s]
    line = min(speeds) if speeds else None
    gbps, rtt = report.get("gbps"), report.get("rtt_ms")
    if not report.get("ok"):
        return LinkResult(pair, False, gbps, rtt, line, str(report.get("reason") or "failed"))
    if line is None:
        return LinkResult(pair, True, gbps, rtt, None, None)
    ratio = (gbps or 0.0) / line
    if ratio + 1e-12 >= threshold:
        return LinkResult(pair, True, gbps, rtt, line, None)
    return LinkResult(pair, False, gbps, rtt, line,
                      f"slow: {gbps:.3g} Gb/s is {ratio * 100:.2g}% of the {line:g} Gb/s line rate of "
                      f"{pair.src.nic}/{pair.dst.nic} (threshold {threshold:.0%})")


def engine_args(ep: Endpoint, transport: str) -> list[str]:
    """Mooncake over an ib/roce NIC measures RDMA on that device; everything else is TCP."""
    if transport == "mooncake" and ep.kind in ("ib", "roce"):
        return ["--protocol", "rdma", "--device", ep.nic]
    return []


def _first_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            return doc
    return None


@dataclass
class _Server:
    endpoint: Endpoint
    port: int
    spawned: Spawned | None
    error: str | None


def _start_server(runner: NodeRunner, ep: Endpoint, port: int, transport: str, idle: float,
                  ready_timeout: float) -> _Server:
    argv = [runner.python, *AGENT, "serve", "--host", ep.ip, "--port", str(port),
            "--transport", transport, "--idle-timeout", str(idle), *engine_args(ep, transport)]
    try:
        sp = runner.spawn(argv)
    except Exception as e:  # noqa: BLE001 - becomes the reason of every pair into this node
        return _Server(ep, port, None, f"agent could not start on {ep.node}: {e}")
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        line = sp.readline(max(0.1, deadline - time.monotonic()))
        if line is None:
            break
        doc = _first_json(line)
        if doc is None:
            continue
        if doc.get("ready"):
            return _Server(ep, port, sp, None)
        sp.close()
        return _Server(ep, port, None, f"agent on {ep.node}: {doc.get('error') or doc}")
    sp.close()
    return _Server(ep, port, None, f"agent on {ep.node} did not start listening on "
                                   f"{ep.ip}:{port} within {ready_timeout:g} s")


def measure(pairs: Sequence[LinkPair], runners: Mapping[str, NodeRunner], *,
            transport: str = "zmq", seconds: float = 0.5, threshold: float = DEFAULT_THRESHOLD,
            agent_port: int = DEFAULT_AGENT_PORT, connect_timeout: float = 3.0,
            ready_timeout: float = 30.0) -> list[LinkResult]:
    """Start one agent server per receiving endpoint, run the senders round by round."""
    dsts: dict[tuple[str, str, str], Endpoint] = {}
    for p in pairs:
        dsts.setdefault((p.dst.node, p.dst.nic, p.dst.ip), p.dst)
    ports: dict[tuple[str, str, str], int] = {}
    per_node: dict[str, int] = {}
    for key in dsts:
        ports[key] = agent_port + per_node.get(key[0], 0)
        per_node[key[0]] = per_node.get(key[0], 0) + 1
    idle = max(20.0, 3 * (seconds + connect_timeout))
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(dsts)))) as pool:
        servers = dict(zip(dsts, pool.map(
            lambda k: _start_server(runners[k[0]], dsts[k], ports[k], transport, idle,
                                    ready_timeout), dsts)))
    results: dict[int, LinkResult] = {}
    index = {id(p): i for i, p in enumerate(pairs)}
    try:
        for batch in rounds(pairs):
            with ThreadPoolExecutor(max_workers=max(1, len(batch))) as pool:
                done = pool.map(lambda p: _send(p, runners[p.src.node], servers, transport,
                                                seconds, threshold, connect_timeout), batch)
                for p, r in zip(batch, done):
                    results[index[id(p)]] = r
    finally:
        for s in servers.values():
            if s.spawned is not None:
                s.spawned.close()
    return [results[i] for i in range(len(pairs))]


def _send(pair: LinkPair, runner: NodeRunner, servers: Mapping[tuple[str, str, str], _Server],
          transport: str, seconds: float, threshold: float, connect_timeout: float) -> LinkResult:
    server = servers[(pair.dst.node, pair.dst.nic, pair.dst.ip)]
    if server.error:
        return LinkResult(pair, False, None, None, None, server.error)
    argv = [runner.python, *AGENT, "send", "--to", f"{pair.dst.ip}:{server.port}",
            "--src", pair.src.ip, "--transport", transport, "--seconds", str(seconds),
            "--connect-timeout", str(connect_timeout), *engine_args(pair.src, transport)]
    try:
        res = runner.run(argv, timeout=seconds + 4 * connect_timeout + 30)
    except Exception as e:  # noqa: BLE001 - an unreachable sender is this pair's finding
        return LinkResult(pair, False, None, None, None,
                          f"agent could not run on {pair.src.node}: {e}")
    doc = _first_json(res.stdout)
    if doc is None:
        err = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return LinkResult(pair, False, None, None, None,
                          f"agent on {pair.src.node} failed (exit {res.rc}): {err}")
    log.debug("link %s rail %d: %s", pair.label, pair.rail, doc)
    result = evaluate(pair, doc, threshold)
    if not result.ok and transport == "mooncake":
        result = _with_engine_log(result, res.stderr)
    return result


def _with_engine_log(result: LinkResult, stderr: str) -> LinkResult:
    """Add the Mooncake engine's own error line and its cause to a failed pair's reason."""
    from epdctl.preflight.mooncake_log import judge_mooncake

    worst = [f for f in judge_mooncake(stderr or "").findings if f.level != "pass"]
    if not worst:
        return result
    f = next((f for f in worst if f.level == "fail"), worst[0])
    return LinkResult(result.pair, False, result.gbps, result.rtt_ms, result.line_gbps,
                      f"{result.reason}; Mooncake: {f.message} -> {f.advice}")

