"""How to reach each node of an ssh cluster, run the agent there, and remember the nodes.

A ``NodeAccess`` is one node's SSH target (jumps included), its setup lines, python and
environment, built from the topology. The list is written to ``ssh-nodes.json`` in the
cluster's run folder at `up`, so later commands (`status`, `logs`, `down`, from any shell)
reach the same machines without the topology. It holds no secret: keys are paths.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from epdctl.errors import LaunchError
from epdctl.launchers.ssh.config import SSHOptions, SSHTarget, default_known_hosts, parse_destination
from epdctl.topology.model import Topology

NODES_FILE = "ssh-nodes.json"
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class NodeAccess:
    """How to reach one node and prepare its shell (no secrets: the key is a path)."""

    node: str
    target: SSHTarget
    setup: tuple[str, ...] = ()
    python: str = "python3"
    env: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "target": asdict(self.target), "setup": list(self.setup),
                "python": self.python, "env": dict(self.env)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "NodeAccess":
        def target(t: dict[str, Any] | None) -> SSHTarget | None:
            if t is None:
                return None
            return SSHTarget(**{**t, "jump": target(t.get("jump"))})

        return cls(node=d["node"], target=target(d["target"]),  # type: ignore[arg-type]
                   setup=tuple(d.get("setup", ())), python=d.get("python", "python3"),
                   env=dict(d.get("env", {})))


def nodes_from_topology(topo: Topology) -> dict[str, NodeAccess]:
    """Node name -> NodeAccess. ``ssh.jump`` may name another node or be [user@]host[:port]."""
    by_name = {n.name: n for n in topo.nodes}

    def target(n: Any, seen: tuple[str, ...]) -> SSHTarget:
        ssh = n.ssh
        jump = None
        if ssh.jump:
            if ssh.jump in by_name:
                if ssh.jump in seen:
                    raise LaunchError(f"[{n.name}] ssh.jump loops back to {ssh.jump}")
                jump = target(by_name[ssh.jump], seen + (n.name,))
            else:
                jump = parse_destination(ssh.jump, n.name)
        port = ssh.port if ssh.port != 22 else None  # 22 is the schema default: let ssh config decide
        return SSHTarget(node=n.name, host=n.host, user=ssh.user, port=port, key=ssh.key, jump=jump)

    python = getattr(topo, "python", "python3") or "python3"
    return {n.name: NodeAccess(n.name, target(n, ()), tuple(n.setup), python, dict(n.env))
            for n in topo.nodes}


def options_from_env(accept_new: bool | None) -> SSHOptions:
    """Defaults, adjustable without a CLI flag: EPDCTL_KNOWN_HOSTS, EPDCTL_SSH_CONFIG (empty:
    read none), EPDCTL_SSH_ACCEPT_NEW_HOST_KEYS=1, EPDCTL_SSH_TIMEOUT (seconds); the node run
    folder root comes from EPDCTL_SSH_RUN_ROOT."""
    if accept_new is None:
        accept_new = os.environ.get("EPDCTL_SSH_ACCEPT_NEW_HOST_KEYS", "") in ("1", "true", "yes")
    cfg = os.environ.get("EPDCTL_SSH_CONFIG", "~/.ssh/config")
    return SSHOptions(known_hosts=default_known_hosts(), accept_new_host_keys=accept_new,
                      connect_timeout=float(os.environ.get("EPDCTL_SSH_TIMEOUT", "10")),
                      ssh_config=cfg or None)


def expand_local(env: Mapping[str, str]) -> dict[str, str]:
    """Fill ``${VAR}`` from this machine where set; the rest is resolved on the node."""
    return {k: _VAR.sub(lambda m: os.environ.get(m.group(1), m.group(0)), str(v))
            for k, v in env.items()}


def with_overrides(access: NodeAccess, **changes: Any) -> NodeAccess:
    """A copy of ``access`` with target fields replaced (tests, benchmarks)."""
    return replace(access, target=replace(access.target, **changes))


def save_nodes(cdir: Path, doc: dict[str, Any]) -> None:
    """Write the node list (``ssh-nodes.json``) atomically next to the cluster state."""
    (cdir / "logs").mkdir(parents=True, exist_ok=True)  # log mirrors land here
    path = cdir / NODES_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2))
    os.replace(tmp, path)


def load_nodes(cdir: Path) -> dict[str, Any]:
    """The node list of a cluster: ``ssh-nodes.json``, else rebuilt from the topology that
    ``state.json`` names (``nodes`` maps names to NodeAccess)."""
    path = cdir / NODES_FILE
    if path.is_file():
        doc = json.loads(path.read_text())
        doc["nodes"] = {d["node"]: NodeAccess.from_dict(d) for d in doc["nodes"]}
        return doc
    state = cdir / "state.json"
    if not state.is_file():
        raise LaunchError(f"the ssh launcher cannot tell how to reach the nodes of cluster "
                          f"{cdir.name!r}: neither {path} nor {state} exists")
    from epdctl.topology import load_topology  # only when the node list is missing

    topo = load_topology(Path(json.loads(state.read_text())["topology"]))
    return {"nodes": nodes_from_topology(topo),
            "api_key_env": topo.router.api_key_env if topo.router is not None else None}
