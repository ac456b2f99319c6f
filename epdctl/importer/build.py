"""Launch commands -> a topology in epdctl's schema, with a comment at every guess.

Workers come from the commands (one per command, or one per ``--dist-init-addr`` group of a
multi-node server, ranks by ``--node-rank``); roles from ``--disaggregation-mode`` /
``--encoder-only``; nodes from ``--dist-init-addr`` and ``--host``; parallelism, ports, GPUs, NICs
and transfer to first-class keys; everything else to ``args`` in input order; env to the layer
that fits (all servers -> defaults, one worker -> the worker, one node -> the node).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from epdctl.importer.launches import Launch
from epdctl.importer.shell import ScriptError
from epdctl.topology.secrets import looks_secret

LOOPBACK = ("127.0.0.1", "localhost", "::1")
ANY = ("0.0.0.0", "::")
INT_KEYS = {"--tp-size": "tp", "--pp-size": "pp", "--dp-size": "dp", "--attn-dp-size": "attention_dp",
            "--ep-size": "ep", "--chunked-prefill-size": "chunked_prefill_size", "--page-size": "page_size",
            "--max-running-requests": "max_running_requests"}
STR_KEYS = {"--kv-cache-dtype": "kv_cache_dtype", "--moe-a2a-backend": "moe_a2a_backend"}
WIRING = ("--model-path", "--served-model-name", "--host", "--port", "--nnodes", "--node-rank", "--dist-init-addr",
          "--disaggregation-mode", "--encoder-only", "--language-only", "--encoder-urls", "--base-gpu-id",
          "--disaggregation-bootstrap-port", "--encoder-bootstrap-port", "--disaggregation-transfer-backend",
          "--disaggregation-ib-device", "--trust-remote-code", "--mem-fraction-static")
EMBEDDINGS = {"zmq_to_scheduler": "zmq", "mooncake": "mooncake"}


def is_ref(v: str) -> bool:
    return "$" in v


@dataclass
class Worker:
    role: str
    index: int
    ranks: list[Launch]  # by node rank; synthesized ranks repeat rank 0's launch
    synthesized: set[int] = field(default_factory=set)

    @property
    def lead(self) -> Launch:
        return self.ranks[0]

    @property
    def key(self) -> str:
        return f"{self.role}{self.index}"


@dataclass
class Draft:
    """The topology as plain data plus ``comments`` (YAML path -> text) and the import notes."""

    data: dict[str, Any]
    comments: dict[str, str]
    notes: list[str]
    migrations: list[str]
    origin: dict[str, Launch]  # rendered spec name (prefill-0, prefill-0.r1) -> the input launch


def role_of(launch: Launch) -> str:
    if launch.has("--encoder-only") or launch.has("--mm-encoder-only"):
        return "encoder"
    mode = launch.get("--disaggregation-mode")
    if mode in ("prefill", "decode"):
        return mode
    kv = launch.get("--kv-transfer-config") or ""
    if "kv_producer" in kv:
        return "prefill"
    if "kv_consumer" in kv:
        return "decode"
    return "colocated"


def group_workers(servers: list[Launch], notes: list[str]) -> list[Worker]:
    """One worker per single-node command; multi-node commands grouped by role and --dist-init-addr."""
    workers: list[Worker] = []
    groups: dict[tuple[str, str], dict[int, Launch]] = {}
    for s in servers:
        role = role_of(s)
        nnodes = int(s.get("--nnodes", "1") or 1) if (s.get("--nnodes") or "1").isdigit() else 1
        if nnodes <= 1:
            workers.append(Worker(role, 0, [s]))
            continue
        key = (role, s.get("--dist-init-addr") or f"{s.cmd.where}")
        rank_text = s.get("--node-rank", "0") or "0"
        rank = int(rank_text) if rank_text.isdigit() else 0
        ranks = groups.setdefault(key, {})
        if rank in ranks:
            notes.append(f"{s.cmd.where}: a second node-rank {rank} command for {role} at {key[1]}; kept the first")
            continue
        ranks[rank] = s
        if len(ranks) == 1:
            workers.append(Worker(role, 0, [s]))
    for w in workers:
        nnodes_text = w.lead.get("--nnodes") or "1"
        if not nnodes_text.isdigit() or int(nnodes_text) <= 1:
            continue
        ranks = groups[(w.role, w.lead.get("--dist-init-addr") or w.lead.cmd.where)]
        nnodes = int(nnodes_text)
        base = ranks.get(0) or next(iter(ranks.values()))
        w.ranks = [ranks.get(r, base) for r in range(nnodes)]
        w.synthesized = {r for r in range(nnodes) if r not in ranks}
    order = {"encoder": 0, "prefill": 1, "decode": 2, "colocated": 3}
    workers.sort(key=lambda w: order[w.role])
    counts: dict[str, int] = {}
    for w in workers:
        w.index = counts.get(w.role, 0)
        counts[w.role] = w.index + 1
    return workers


def split_addr(addr: str) -> tuple[str, str | None]:
    """``host:port`` (or ``[v6]:port``) -> (host, port)."""
    m = re.match(r"^\[([^\]]+)\]:(\S+)$", addr) or re.match(r"^(.*):([^:]+)$", addr)
    return (m.group(1), m.group(2)) if m else (addr, None)


def secret_env(env: dict[str, str], path: str, comments: dict[str, str]) -> dict[str, str]:
    """Env with secret-looking values replaced by ${NAME} references (commented)."""
    out = {}
    for k, v in env.items():
        if looks_secret(v):
            out[k] = "${" + k + "}"
            comments[f"{path}.{k}"] = "the script had an inline secret here; export it before epdctl up"
        else:
            out[k] = v
    return out


def check_single(servers: list[Launch], flag: str, what: str) -> str | None:
    vals = {v for s in servers if (v := s.get(flag)) is not None}
    if len(vals) > 1:
        raise ScriptError(f"the commands use {len(vals)} different {what} ({', '.join(sorted(vals))}); one "
                           f"topology serves one model: import the sets separately")
    return vals.pop() if vals else None
