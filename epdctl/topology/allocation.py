"""Nodes by count: a ``launcher: slurm`` role may say ``nodes: 2`` instead of naming machines.

Why synthesize nodes instead of teaching placement about counts: under SLURM the scheduler picks
the machines, and the sbatch script already rewrites every node's (placeholder) address to the
allocation's ``${EPD_ADDR_i}``. Turning ``roles.prefill.nodes: 2`` into ordinary nodes
``prefill-n0`` and ``prefill-n1`` (hosts ``prefill-n0.slurm`` ...) keeps placement, ports, checks
and rendering unchanged. Synthesized nodes follow any explicit ``nodes`` in allocation order, role
by role (encoder, prefill, decode, colocated); ``node_defaults`` describes their hardware.
"""

from __future__ import annotations

from typing import Any

from epdctl.launchers.kinds import allocates_nodes
from epdctl.topology.loader import join
from epdctl.topology.model import ROLE_ORDER, Node, Slurm
from epdctl.topology.reader import Reader
from epdctl.topology.schema import MAX_COUNT, MAX_GPUS_PER_NODE, NODE_SETTING_KEYS, read_nics, read_settings

NODE_DEFAULT_KEYS = ("gpus", "nics", "env", "setup", "port_base", "port_stride", "shared", "defaults")
PLACEHOLDER_DOMAIN = "slurm"  # synthesized hosts look like prefill-n0.slurm: never resolved, always rewritten


def counted_roles(top: dict[str, Any]) -> dict[str, Any]:
    """Role name -> its ``nodes`` value, for roles whose ``nodes`` is an integer (not a list)."""
    roles = top.get("roles")
    if not isinstance(roles, dict):
        return {}
    out: dict[str, Any] = {}
    for role in ROLE_ORDER:
        m = roles.get(role.value)
        if isinstance(m, dict) and isinstance(m.get("nodes"), int) and not isinstance(m.get("nodes"), bool):
            out[role.value] = m["nodes"]
    return out


def synthesize(r: Reader, top: dict[str, Any], launcher: str | None, slurm: Slurm | None,
               taken: set[str]) -> tuple[tuple[Node, ...], dict[str, dict[str, Any]], dict[str, tuple[str, ...]]]:
    """(synthesized nodes, their settings layers, role -> its node names); problems go to ``r``."""
    counts = counted_roles(top)
    if not counts:
        if top.get("node_defaults") is not None:
            r.problem("node_defaults", "node_defaults describes nodes synthesized from a role's node count "
                                       "(roles.<role>.nodes: N with launcher: slurm), but no role gives a count; "
                                       "remove node_defaults or give a role nodes: N")
        return (), {}, {}
    if not allocates_nodes(launcher):
        for role in counts:
            r.problem(f"roles.{role}.nodes",
                      f"nodes: {counts[role]} (a number of allocation nodes) needs launcher: slurm, where the "
                      f"scheduler picks the machines; with launcher {launcher or 'local'} list node names "
                      f"instead, e.g. nodes: [n0, n1], or set launcher: slurm")
        return (), {}, {}
    template, layer = _read_template(r, top, slurm)
    nodes: list[Node] = []
    layers: dict[str, dict[str, Any]] = {}
    by_role: dict[str, tuple[str, ...]] = {}
    for role, count in counts.items():
        path = f"roles.{role}.nodes"
        if not 1 <= count <= MAX_COUNT:
            r.problem(path, f"nodes must be between 1 and {MAX_COUNT} allocation nodes, got {count}")
            continue
        names = []
        for i in range(count):
            name = f"{role}-n{i}"
            if name in taken:
                r.problem(path, f"role {role} would create node {name!r}, but the nodes list already defines it; "
                                f"rename that node (names like {role}-n0 are reserved for counted roles)")
                continue
            port_base = template["port_base"]
            if port_base is not None:
                port_base += len(nodes) * template["port_stride"]
                if port_base > 65535:
                    r.problem("node_defaults.port_stride", f"node {name!r} would start its ports at {port_base}, "
                                                           f"past 65535; lower port_base or port_stride")
                    port_base = None
            nodes.append(Node(name=name, host=f"{name}.{PLACEHOLDER_DOMAIN}", gpus=template["gpus"],
                              nics=template["nics"], env=dict(template["env"]), setup=template["setup"],
                              port_base=port_base, shared=template["shared"]))
            layers[name] = layer
            names.append(name)
        by_role[role] = tuple(names)
    return tuple(nodes), layers, by_role


def _read_template(r: Reader, top: dict[str, Any], slurm: Slurm | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """What every synthesized node has: ``node_defaults`` (GPUs default to slurm.gpus_per_node)."""
    gpus_default = slurm.gpus_per_node if slurm is not None and slurm.gpus_per_node is not None else 0
    empty = {"gpus": gpus_default, "nics": (), "env": {}, "setup": (), "port_base": None, "port_stride": 0,
             "shared": False}
    if top.get("node_defaults") is None:
        return empty, {}
    p = "node_defaults"
    m = r.mapping(top["node_defaults"], p, NODE_DEFAULT_KEYS, "node_defaults")
    if m is None:
        return empty, {}
    layer: dict[str, Any] = {}
    if m.get("defaults") is not None:
        d = r.mapping(m["defaults"], join(p, "defaults"), NODE_SETTING_KEYS, "node defaults")
        if d is not None:
            layer = read_settings(r, d, join(p, "defaults"), NODE_SETTING_KEYS)
    port_base = r.get(m, p, "port_base", "int", minimum=1, maximum=65535)
    stride = r.get(m, p, "port_stride", "int", default=0, minimum=0, maximum=65535)
    if stride and port_base is None:
        r.problem(join(p, "port_stride"), "port_stride spaces the nodes' port ranges from port_base; set port_base too")
    return {"gpus": r.get(m, p, "gpus", "int", default=gpus_default, minimum=0, maximum=MAX_GPUS_PER_NODE),
            "nics": read_nics(r, m, p), "env": r.env(m, p), "setup": r.get(m, p, "setup", "strlist", default=()),
            "port_base": port_base, "port_stride": stride or 0,
            "shared": r.get(m, p, "shared", "bool", default=False)}, layer
