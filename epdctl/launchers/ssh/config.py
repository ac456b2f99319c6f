"""Where a node's sshd is and how to log in: topology fields, then ``~/.ssh/config``.

What the topology names (user, port, identity file, jump host) wins; the ssh config fills in
what it leaves out (HostName, User, Port, IdentityFile, ProxyJump, chains included); then the
defaults (the local user, port 22). Kept apart from the connection itself so it stays pure.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass, replace
from pathlib import Path

import paramiko

from epdctl.errors import LaunchError


class SSHError(LaunchError):
    """Connecting to a node or running a command on it failed."""


@dataclass(frozen=True)
class SSHTarget:
    """Where one node's sshd is and how to log in. ``node`` names it in messages."""

    node: str
    host: str
    user: str | None = None
    port: int | None = None
    key: str | None = None
    jump: "SSHTarget | None" = None


@dataclass(frozen=True)
class SSHOptions:
    """Connection policy shared by all nodes of one command."""

    known_hosts: tuple[str, ...] = ("~/.ssh/known_hosts",)
    accept_new_host_keys: bool = False
    connect_timeout: float = 10.0
    command_timeout: float = 120.0
    ssh_config: str | None = "~/.ssh/config"  # None: do not read any ssh config


def parse_destination(text: str, node: str) -> SSHTarget:
    """``[user@]host[:port]`` (a ProxyJump element) -> SSHTarget."""
    user, _, hostport = text.rpartition("@")
    host, port = hostport, None
    if hostport.startswith("["):  # [v6addr]:port
        host, _, rest = hostport[1:].partition("]")
        port = int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    elif hostport.count(":") == 1:
        host, _, p = hostport.partition(":")
        if not p.isdigit():
            raise SSHError(f"[{node}] bad jump host {text!r}: port must be a number")
        port = int(p)
    if not host:
        raise SSHError(f"[{node}] bad jump host {text!r}: expected [user@]host[:port]")
    return SSHTarget(node=node, host=host, user=user or None, port=port)


def resolve(target: SSHTarget, options: SSHOptions) -> SSHTarget:
    """Fill what the target leaves open from ssh config, then defaults (user, port 22)."""
    cfg: dict = {}
    if options.ssh_config:
        path = Path(options.ssh_config).expanduser()
        if path.is_file():
            try:
                cfg = paramiko.SSHConfig.from_path(str(path)).lookup(target.host)
            except (OSError, paramiko.ConfigParseError) as e:
                raise SSHError(f"[{target.node}] cannot read ssh config {path}: {e}") from e
    host = cfg.get("hostname", target.host)
    user = target.user or cfg.get("user") or getpass.getuser()
    port = target.port or int(cfg.get("port", 22))
    key = target.key
    if key is None and cfg.get("identityfile"):
        key = cfg["identityfile"][0]
    jump = target.jump
    if jump is None and cfg.get("proxyjump") and cfg["proxyjump"].lower() != "none":
        hops = [h.strip() for h in cfg["proxyjump"].split(",") if h.strip()]
        for hop in hops:  # a,b,c: reach b through a, then c through b
            jump = replace(parse_destination(hop, f"{target.node} via {hop}"), jump=jump)
    if jump is not None:
        jump = resolve(jump, options)
    return SSHTarget(node=target.node, host=host, user=user, port=port,
                     key=str(Path(key).expanduser()) if key else None, jump=jump)


def host_key_name(host: str, port: int) -> str:
    """How known_hosts names a host (``[host]:port`` unless the port is 22)."""
    return host if port == 22 else f"[{host}]:{port}"


def default_known_hosts() -> tuple[str, ...]:
    """~/.ssh/known_hosts, plus $EPDCTL_KNOWN_HOSTS (os.pathsep-separated) first if set."""
    extra = os.environ.get("EPDCTL_KNOWN_HOSTS")
    base = ("~/.ssh/known_hosts",)
    return tuple(extra.split(os.pathsep)) + base if extra else base
