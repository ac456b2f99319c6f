"""Found nodes -> a commented topology: nodes and NICs as reported, an E:P:D split, transfer backend.

How the split is chosen (each choice is written into the file as a comment):
* worker size: encoders run TP1 (a vision tower fits one GPU; they scale by data parallelism);
  prefill/decode use ``--tp`` if given, else the smallest power of two whose share of the bf16
  weights (estimated from the model's config.json) stays under 60% of one GPU's memory, else 1;
* three nodes or more: whole nodes per role (no two roles compete for a node's PCIe and NICs),
  about a fifth of the nodes for encoders (at least one), the rest split between prefill and
  decode, decode taking the odd node (it holds KV caches for whole generations);
* one or two nodes: roles share nodes (``shared: true``), GPUs dealt out in node order: about a
  fifth to encoders, the rest alternately to prefill and decode workers of ``tp`` GPUs;
* text-only models (an architecture SGLang cannot split off an encoder for) get no encoder role.
Transfer: Mooncake for SGLang (over RDMA when every node has an ib/roce NIC, else TCP), ZMQ for
the embedded CPU engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from epdctl.errors import EpdctlError
from epdctl.init.inventory import Inventory
from epdctl.launchers.ssh.config import parse_destination
from epdctl.engines import CPU_ENGINE, GPU_ENGINE, engine_for

WEIGHT_SHARE = 0.6  # of one GPU's memory for a worker's share of the weights; the rest is KV cache


@dataclass
class NodeIn:
    name: str
    destination: str           # what the user gave: host, user@host:port, or a SLURM node name
    inv: Inventory


@dataclass
class Choice:
    engine: str
    tp: int
    vlm: bool
    roles: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # role -> [(node, gpus)]
    why: list[str] = field(default_factory=list)


def _model_params(model_path: str) -> int | None:
    """Parameter estimate from config.json (text config of VLMs): layers * (attention + 3hi) + 2Vh,
    attention = 2h^2 + 2h * kv_dim (grouped-query attention when num_key_value_heads is given)."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    try:
        h, layers = int(text["hidden_size"]), int(text["num_hidden_layers"])
        inter, vocab = int(text.get("intermediate_size", 4 * h)), int(text.get("vocab_size", 32000))
    except (KeyError, TypeError, ValueError):
        return None
    heads = int(text.get("num_attention_heads") or 1)
    kv_dim = h * int(text.get("num_key_value_heads") or heads) // heads
    return layers * (2 * h * h + 2 * h * kv_dim + 3 * h * inter) + 2 * vocab * h


def architecture(model_path: str, given: str | None) -> str | None:
    if given:
        return given
    try:
        archs = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8")).get("architectures")
    except (OSError, ValueError, AttributeError):
        return None
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None


def _tp(nodes: list[NodeIn], model_path: str, given: int | None, why: list[str]) -> int:
    per_node = min(len(n.inv.gpus) for n in nodes)
    if given:
        why.append(f"prefill/decode TP{given}: given with --tp")
        return given
    params = _model_params(model_path)
    mems = [g.memory_mib for n in nodes for g in n.inv.gpus if g.memory_mib]
    if params is None or not mems:
        why.append(f"prefill/decode TP1: {'no readable config.json at ' + model_path if params is None else 'GPU memory unknown'}"
                   f"; pass --tp to size workers for a large model")
        return 1
    need = 2 * params / (WEIGHT_SHARE * min(mems) * 2**20)
    tp = 1
    while tp < need and tp < per_node:
        tp *= 2
    why.append(f"prefill/decode TP{tp}: ~{params / 1e9:.1f}B parameters = {2 * params / 2**30:.0f} GiB in bf16, "
               f"kept under {WEIGHT_SHARE:.0%} of a {min(mems) // 1024} GiB GPU")
    return tp


def choose(nodes: list[NodeIn], model_path: str, arch: str | None, engine: str | None, tp: int | None) -> Choice:
    """The engine, worker size and role placement, with the reasons."""
    gpus = [len(n.inv.gpus) for n in nodes]
    engine = engine or (GPU_ENGINE if all(gpus) else CPU_ENGINE)
    why = [f"engine {engine}: " + ("every node has GPUs" if all(gpus) else "a node without GPUs: the embedded CPU "
                                   f"runtime (pass --engine {GPU_ENGINE} to override)")]
    eng = engine_for(engine)
    supported = eng.epd_architectures
    vlm = arch is None or supported is None or arch in supported
    why.append("encoder role: " + ("yes, " + (f"{arch} supports {eng.label} EPD" if arch else "architecture unknown, "
                                               "assumed a VLM (pass --arch)") if vlm else
                                   f"no, {eng.label} {eng.version} cannot split the encoder off {arch}"))
    if len(set(gpus)) > 1:
        why.append(f"nodes differ in GPU count ({gpus}); sized by the smallest")
    size = _tp(nodes, model_path, tp, why) if eng.uses_gpus else 1
    per_node = min(gpus) if eng.uses_gpus else 1
    c = Choice(engine, size, vlm, why=why)
    roles = (["encoder"] if vlm else []) + ["prefill", "decode"]
    if len(nodes) >= len(roles):
        e = max(1, round(len(nodes) / 5)) if vlm else 0
        p = (len(nodes) - e) // 2
        split = {"encoder": nodes[:e], "prefill": nodes[e:e + p], "decode": nodes[e + p:]}
        for role in roles:
            unit = 1 if role == "encoder" else size
            c.roles[role] = [(n.name, unit) for n in split[role] for _ in range(max(1, per_node // unit))]
        c.why.append(f"{len(nodes)} nodes: whole nodes per role, " + ", ".join(
            f"{len(split[r])} {r}" for r in roles) + " (about a fifth for encoders, decode takes the odd node)")
        return c
    _share(c, nodes, roles, per_node)
    return c


def _share(c: Choice, nodes: list[NodeIn], roles: list[str], per_node: int) -> None:
    """Deal GPUs out in node order: one prefill and one decode first, then encoders (about a fifth),
    then prefill/decode alternately; GPUs too few for another TP group serve more encoders."""
    c.roles = {r: [] for r in roles}
    if not engine_for(c.engine).uses_gpus:  # CPU processes: no GPU budget, one worker per role
        where = {"encoder": nodes[0], "prefill": nodes[0], "decode": nodes[-1]}
        c.roles = {r: [(where[r].name, 1)] for r in roles}
        c.why.append(f"{len(nodes)} node(s): one worker per role, roles share nodes (shared: true)")
        return
    free = {n.name: per_node for n in nodes}
    total = per_node * len(nodes)

    def take(units: int) -> str | None:
        for name, left in free.items():
            if left >= units:
                free[name] = left - units
                return name
        return None

    for role in ("prefill", "decode"):
        node = take(c.tp)
        if node is None:
            raise EpdctlError(f"{total} GPU(s) on {len(nodes)} node(s) cannot hold one prefill and one decode worker "
                              f"of TP{c.tp}; add nodes or pass a smaller --tp")
        c.roles[role].append((node, c.tp))
    for _ in range(max(1, round(total / 5)) if c.vlm else 0):
        node = take(1)
        if node:
            c.roles["encoder"].append((node, 1))
    while (node := take(c.tp)) is not None:
        role = "prefill" if len(c.roles["prefill"]) <= len(c.roles["decode"]) else "decode"
        c.roles[role].append((node, c.tp))
    while c.vlm and (node := take(1)) is not None:
        c.roles["encoder"].append((node, 1))
    if c.vlm and not c.roles["encoder"]:
        raise EpdctlError(f"no GPU is left for an encoder after prefill and decode at TP{c.tp}; pass a smaller --tp "
                          f"or --arch of a text-only model")
    c.why.append(f"{len(nodes)} node(s): roles share nodes (shared: true), GPUs dealt out in node order: "
                 + ", ".join(f"{len(c.roles[r])} {r}" for r in roles))


def destination(d: str) -> tuple[str, str | None, int | None]:
    t = parse_destination(d, d)
    return t.host, t.user, t.port
