"""`check --links`: ``ib_write_bw`` between the two NICs of every RDMA link pair, when perftest
is installed on both nodes. The transfer engine's own measurement says whether the engine moves
data; perftest says what the fabric itself gives, and its error lines say why it does not.

Server on the receiving node (``ib_write_bw -d NIC -F --report_gbits -D S -p PORT [-x GID]``),
client on the sending node with the receiver's IP; the client's output is judged like a pasted
perftest output (``perftest_judge``), errors quoted, and the server's last lines added when the
client failed. RoCE pairs use the RoCE v2 IPv4 GID index each node's GID table recommends.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

from epdctl.preflight import rdma_netdev
from epdctl.preflight.links import LinkPair
from epdctl.preflight.perftest_judge import judge_perftest
from epdctl.preflight.records import RDMA_KINDS, CheckItem, Facts
from epdctl.preflight.runners import NodeRunner

TOOL = "ib_write_bw"
log = logging.getLogger(__name__)


def installed(facts: Facts | None) -> bool:
    """The agent's ``ib_write_bw --version`` probe ran (rc 127 means not installed)."""
    p = (facts.probes.get("ib_write_bw") if facts else None) or {}
    return bool(p) and p.get("rc") != 127


def _gid_index(facts: Facts | None, nic: str) -> int | None:
    text = facts.text("gid_table") if facts else None
    best = rdma_netdev.recommend_gid(rdma_netdev.read_show_gids(text or "")).get(nic)
    return best[0] if best else None


def _argv(nic: str, seconds: int, port: int, gid: int | None) -> list[str]:
    return [TOOL, "-d", nic, "-F", "--report_gbits", "-D", str(seconds), "-p", str(port),
            *(["-x", str(gid)] if gid is not None else [])]


def measure_pairs(pairs: Sequence[LinkPair], runners: Mapping[str, NodeRunner],
                  facts: Mapping[str, Facts], *, port: int, seconds: int = 2,
                  threshold: float = 0.8) -> list[CheckItem]:
    items: list[CheckItem] = []
    for pair in pairs:
        src, dst = pair.src, pair.dst
        if src.kind not in RDMA_KINDS or dst.kind not in RDMA_KINDS:
            continue
        if not (installed(facts.get(src.node)) and installed(facts.get(dst.node))):
            continue
        try:
            items.append(_one(pair, runners, facts, port, seconds, threshold))
        except Exception as e:  # noqa: BLE001 - one pair's surprise is that pair's finding
            log.debug("%s %s raised", TOOL, pair.label, exc_info=True)
            items.append(CheckItem(pair.label, f"{TOOL} rail {pair.rail}", False,
                                   f"could not run {TOOL}: {type(e).__name__}: {e}"))
    return items


def _one(pair: LinkPair, runners: Mapping[str, NodeRunner], facts: Mapping[str, Facts],
         port: int, seconds: int, threshold: float) -> CheckItem:
    src, dst = pair.src, pair.dst
    check = f"{TOOL} rail {pair.rail} {src.nic}->{dst.nic}"
    server = runners[dst.node].spawn(_argv(dst.nic, seconds, port,
                                           _gid_index(facts.get(dst.node), dst.nic)))
    server_lines: list[str] = []
    try:
        for _ in range(40):                     # up to the banner, or ~4 s
            line = server.readline(0.1)
            if line is None:
                if server_lines:
                    break
                continue
            server_lines.append(line.rstrip("\n"))
            if "Waiting for client" in line or "BW Test" in line:
                break
        client = runners[src.node].run(
            [*_argv(src.nic, seconds, port, _gid_index(facts.get(src.node), src.nic)), dst.ip],
            timeout=seconds + 30)
        while (line := server.readline(0.5)) is not None and len(server_lines) < 200:
            server_lines.append(line.rstrip("\n"))
    finally:
        server.close()
    j = judge_perftest(client.stdout + "\n" + client.stderr)
    return _item(pair, check, j, server_lines, threshold)


def _item(pair: LinkPair, check: str, j: Any, server_lines: list[str],
          threshold: float) -> CheckItem:
    avg = j.facts.get("avg_gbps")
    fails = [f for f in j.findings if f.level == "fail"]
    if fails or avg is None:
        why = "; ".join(f"{f.message} -> {f.advice}" for f in fails) or (
            j.findings[0].message if j.findings else "no result")
        tail = [ln for ln in server_lines if ln.strip() and not ln.startswith(("-", "*"))][-2:]
        said = f" (server: {' | '.join(tail)})" if tail and fails else ""
        return CheckItem(pair.label, check, False, f"{why}{said}")
    speeds = [s for s in (pair.src.speed_gbps, pair.dst.speed_gbps) if s]
    line = min(speeds) if speeds else None
    ok = line is None or avg >= threshold * line
    detail = f"{avg:g} Gb/s ib_write_bw average ({j.facts.get('link_type', '?')})"
    if line is not None:
        detail += f", {avg / line:.0%} of {line:g} Gb/s" + ("" if ok else
                                                            f" (below {threshold:.0%})")
    return CheckItem(pair.label, check, ok, detail)
