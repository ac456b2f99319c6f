"""Which workers can change role in place (``rebalance: {in_place: true}`` in the topology).

embedded: every encoder, prefill and decode started ``--switchable`` keeps the whole model and
switches between all three roles (docs/rebalance.md).
SGLang 0.5.23: ``--enable-pd-role-switch`` flips prefill <-> decode through ``POST
/pd_role_switch``; its own argument check (``sglang/srt/arg_groups/pd_disaggregation_hook.py``)
refuses expert or pipeline parallelism, MoE all-to-all, decode context parallelism and
speculative decoding, and only KV managers with ``supports_role_switch`` (Mooncake, Mori; not
NIXL) can flip. An EPD prefill is ``--language-only`` with ``--encoder-urls``, which a flip
does not rebuild, so with encoders in the topology SGLang moves restart. vLLM: always restart.
"""

from __future__ import annotations

from epdctl.topology.model import Role, Topology, Worker

SWITCHABLE_ROLES = (Role.ENCODER, Role.PREFILL, Role.DECODE)
SGLANG_ROLES = (Role.PREFILL, Role.DECODE)
SGLANG_BACKENDS = ("mooncake",)
_SGLANG_ARGS = ("--speculative-algorithm", "--dcp-size", "--ep-size", "--expert-parallel-size", "--ep",
                "--pp-size", "--pipeline-parallel-size")


def sglang_blockers(topo: Topology, w: Worker) -> list[str]:
    """Why SGLang cannot flip ``w`` between prefill and decode (empty: it can)."""
    s = w.settings
    out = []
    if topo.has_encoders:
        out.append("the prefills are --language-only with --encoder-urls (EPD), which a flip does not rebuild")
    if topo.transfer.backend not in SGLANG_BACKENDS:
        out.append(f"transfer backend {topo.transfer.backend} has no role switch (Mooncake does)")
    if s.ep is not None and s.ep > 1:
        out.append(f"expert parallelism (ep {s.ep})")
    if s.pp > 1:
        out.append(f"pipeline parallelism (pp {s.pp})")
    if s.moe_a2a_backend and s.moe_a2a_backend != "none":
        out.append(f"MoE all-to-all ({s.moe_a2a_backend})")
    out += [f"{a} in args" for a in _SGLANG_ARGS if a in s.args]
    return out


def blockers(topo: Topology, w: Worker) -> list[str]:
    """Why ``w`` cannot be started switchable (empty: it is, when the topology asks for it)."""
    if not topo.in_place:
        return ["the topology does not ask for it (rebalance: {in_place: true})"]
    if topo.engine == "embedded":
        return [] if w.role in SWITCHABLE_ROLES else [f"a {w.role.value} worker does not switch"]
    if topo.engine == "sglang":
        if w.role not in SGLANG_ROLES:
            return [f"SGLang switches only prefill <-> decode, not {w.role.value}"]
        return sglang_blockers(topo, w)
    return [f"{topo.engine} has no in-place role switch"]


def switchable(topo: Topology, w: Worker) -> bool:
    return not blockers(topo, w)


def move_path(topo: Topology, src: Worker, new_role: Role) -> tuple[str, str]:
    """("in-place" | "restart", why) for moving ``src`` to ``new_role``."""
    why = blockers(topo, src)
    if not why and topo.engine == "sglang" and new_role not in SGLANG_ROLES:
        why = [f"SGLang switches only prefill <-> decode, not to {new_role.value}"]
    if why:
        return "restart", "; ".join(why)
    how = "POST /pd_role_switch" if topo.engine == "sglang" else "POST /admin/switch_role"
    return "in-place", f"{how}, model stays loaded"
