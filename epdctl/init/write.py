"""The topology text `epdctl init` writes: YAML with a comment on every choice it made."""

from __future__ import annotations

import json
import time
from typing import Sequence

from epdctl.engines import Engine, engine_for
from epdctl.launchers.kinds import launcher_kind
from epdctl.init.compose import Choice, NodeIn, destination
from epdctl.init.inventory import FoundNic

SCHEMA_FILE = "topology/topology.schema.json"


def _q(value: object) -> str:
    return json.dumps(value)  # a JSON scalar is a valid YAML flow scalar


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _nic(n: FoundNic) -> str:
    parts = [f"name: {_q(n.name)}", f"kind: {n.kind}"]
    if n.ip:
        parts.append(f"ip: {_q(n.ip)}")
    if n.speed_gbps:
        parts.append(f"speed_gbps: {_num(n.speed_gbps)}")
    note = f"  # {n.note}" if n.note else ("" if n.speed_gbps else "  # speed not reported: add speed_gbps")
    return "      - {" + ", ".join(parts) + "}" + note


def _transport(nodes: Sequence[NodeIn], engine: Engine) -> tuple[str, str]:
    if not engine.uses_gpus:
        return "zmq", f"{engine.name} CPU runtime: ZMQ over TCP (mooncake also works where installed)"
    rdma = [n for n in nodes if n.inv.rdma]
    if len(rdma) == len(nodes):
        kinds = sorted({x.kind for n in nodes for x in n.inv.rdma})
        if len(kinds) > 1:
            return "mooncake", ("nodes mix InfiniBand and RoCE NICs, which cannot reach each other: give the "
                                "transfer NICs of one fabric (transfer.nics) or check the cabling")
        return "mooncake", f"every node has an RDMA NIC ({kinds[0]}): Mooncake over RDMA"
    lacking = ", ".join(n.name for n in nodes if not n.inv.rdma)
    return "mooncake", f"no RDMA NIC on {lacking}: Mooncake falls back to TCP; expect slow KV transfer"


def render(name: str, nodes: Sequence[NodeIn], c: Choice, *, model_path: str, arch: str | None, launcher: str,
           python: str, setup: Sequence[str], how: str, schema_path: str, ssh_key: str | None = None,
           partition: str | None = None, missing: Sequence[str] = ()) -> str:
    """The whole file; ``how`` says how the nodes were reached (for the header)."""
    engine, kind = engine_for(c.engine), launcher_kind(launcher)
    backend, why_backend = _transport(nodes, engine)
    shared = {node for role in c.roles.values() for node, _ in role}
    roles_of = {n.name: {r for r, ws in c.roles.items() for node, _ in ws if node == n.name} for n in nodes}
    out = [f"# yaml-language-server: $schema={schema_path}",
           f"# Written by `epdctl init` on {time.strftime('%Y-%m-%d %H:%M')} from what {len(nodes)} node(s) "
           f"reported ({how}). A starting point: check it with `epdctl validate` and `epdctl check --links`.",
           "# How it was chosen:"]
    out += [f"#   - {w}" for w in c.why] + [f"#   - transfer: {why_backend}"]
    out += [f"# Not reached (left out): {m}" for m in missing]
    out += [f"name: {_q(name)}", f"engine: {c.engine}", f"launcher: {launcher}", f"python: {_q(python)}",
            "model:", f"  path: {_q(model_path)}"]
    if arch:
        out.append(f"  architecture: {_q(arch)}")
    if len(nodes) > 1:
        out += ["defaults:", "  host: node   # listen on each node's own address (workers talk across machines)"]
    out += ["transfer:", f"  backend: {backend}"]
    out.append("nodes:")
    for n in nodes:
        host, user, port = destination(n.destination)
        out += [f"  - name: {_q(n.name)}", f"    host: {_q(n.name if kind.allocates_nodes else host)}"]
        ssh = {k: v for k, v in (("user", user), ("port", port), ("key", ssh_key)) if v is not None}
        if ssh and kind.ssh:
            out.append("    ssh: {" + ", ".join(f"{k}: {_q(v)}" for k, v in ssh.items()) + "}")
        gpus = n.inv.gpus
        desc = f"{len(gpus)} x {gpus[0].name}" + (f", {gpus[0].memory_mib} MiB" if gpus[0].memory_mib else "") \
            if gpus else "no GPU found"
        out.append(f"    gpus: {len(gpus)}   # {desc}")
        if len(roles_of[n.name]) > 1:
            out.append(f"    shared: true   # runs {', '.join(sorted(roles_of[n.name]))}")
        if setup:
            out.append("    setup: [" + ", ".join(_q(s) for s in setup) + "]")
        out += [f"    # {note}" for note in n.inv.notes]
        if n.inv.nics:
            out.append("    nics:")
            out += [_nic(x) for x in n.inv.nics]
        if n.name not in shared:
            out.append("    # no worker placed here")
    out.append("roles:")
    for role, workers in c.roles.items():
        if not workers:
            continue
        out.append(f"  {role}:")
        if engine.uses_gpus and role != "encoder" and c.tp > 1:
            out.append(f"    tp: {c.tp}")
        out.append("    workers:")
        out += [f"      - {{node: {_q(node)}}}" for node, _ in workers]
    router_node = c.roles["prefill"][0][0]
    out += ["router:", f"  node: {_q(router_node)}   # beside the first prefill worker"]
    if kind.allocates_nodes:
        out += ["slurm:", f"  partition: {_q(partition)}" if partition else "  # partition: set yours",
                '  time: "01:00:00"   # the job\'s time limit: set what you need']
        if nodes and all(n.inv.gpus for n in nodes):
            out.append(f"  gpus_per_node: {min(len(n.inv.gpus) for n in nodes)}")
    return "\n".join(out) + "\n"
