"""Values that reach a shell, an sbatch line or a process list: what they may contain.

Two passes over the raw YAML, before and after the schema reads it:

1. ``unsafe_text``: no string anywhere (key or value) may hold a control character (a newline
   would end a comment or an ``#SBATCH`` line and start a command; a line ``EPD_CMD`` would end
   the sbatch here-document) or a lone surrogate (it cannot be written as UTF-8). These are
   reported alone, before anything else reads the document.
2. ``unsafe_values``: names (cluster, nodes) use a safe character set, hosts are host names,
   IP addresses or whole-value ``${NAME}`` references, SLURM names use sbatch's own character sets, SSH users and jump hosts are what
   ssh accepts. Everything else (paths, args, env values, sbatch ``extra`` values) is
   shell-quoted by the renderers.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Iterator

from epdctl.topology.loader import join

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # as state.py's cluster names
NAME_HINT = "letters, digits, '.', '_' and '-', starting with a letter or digit, at most 64 characters"
_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*\.?$")
HOST_WORDS = ("node",)  # `host: node` binds to the node's own address
SLURM_VALUE = re.compile(r"^[A-Za-z0-9._,:@%+=/-]+$")
SLURM_CONSTRAINT = re.compile(r"^[A-Za-z0-9._,:@%+=/&|\[\]*()!-]+$")
SLURM_TIME = re.compile(r"^([0-9]+(-[0-9]{1,2})?(:[0-9]{1,2}){0,2}|infinite|UNLIMITED)$", re.I)
SLURM_OPTION = re.compile(r"^[a-z][a-z0-9-]{0,40}$")
SSH_USER = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._-]{0,31}\$?$")
HOST_KEYS = ("host", "prometheus_host", "ip")
# A whole-value ``${NAME}`` reference (``epdctl import`` keeps a script's unset variables so):
# rendered inside double quotes, the shell expands it to one word and nothing else runs.
VAR_REF = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*\}$")


def describe_char(ch: str) -> str:
    return {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\0": "a NUL byte"}.get(
        ch, f"the character {ascii(ch)}")


def _bad_char(text: str) -> str | None:
    for ch in text:
        o = ord(ch)
        if o < 32 or o == 127 or 0xD800 <= o <= 0xDFFF:
            return ch
    return None


def unsafe_text(data: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(path, message) for every string holding a control character or a lone surrogate."""
    if isinstance(data, dict):
        for key, value in data.items():
            kpath = join(path, key if isinstance(key, (int, str)) else str(key))
            if isinstance(key, str) and (ch := _bad_char(key)) is not None:
                yield path, f"key {ascii(key)} holds {describe_char(ch)}; keys are plain names"
                continue
            yield from unsafe_text(value, kpath)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from unsafe_text(value, join(path, i))
    elif isinstance(data, str) and (ch := _bad_char(data)) is not None:
        kind = "a lone surrogate" if 0xD800 <= ord(ch) <= 0xDFFF else describe_char(ch)
        yield path, (f"value {ascii(data[:60])} holds {kind}; values reach shell scripts and sbatch lines, "
                     "so they must be one line of printable text")


def is_host(value: str) -> bool:
    """A host name (RFC 1123, '_' tolerated) or an IPv4/IPv6 address (brackets allowed)."""
    try:
        ipaddress.ip_address(value[1:-1] if value.startswith("[") and value.endswith("]") else value)
        return True
    except ValueError:
        return bool(HOSTNAME.match(value)) and not value.replace(".", "").isdigit()


def _host(path: str, value: Any, words: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    if isinstance(value, str) and value not in words and not is_host(value) and not VAR_REF.match(value):
        yield path, f"{ascii(value)} is not a host name, an IP address or a ${{NAME}} reference"


def _name(path: str, value: Any, what: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str) and not NAME.match(value):
        yield path, f"{what} {ascii(value)} may use only {NAME_HINT}"


def _jump(path: str, value: Any) -> Iterator[tuple[str, str]]:
    if not isinstance(value, str):
        return
    for hop in value.split(","):
        user, _, rest = hop.rpartition("@")
        host, _, port = rest.rpartition(":") if rest.count(":") == 1 else (rest, "", "")
        if (user and not SSH_USER.match(user)) or not is_host(host) or (port and not port.isdigit()):
            yield path, f"jump host {ascii(hop)} must be [user@]host[:port]"
            return


def _slurm(m: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for key in ("partition", "account", "qos"):
        v = m.get(key)
        if isinstance(v, str) and not SLURM_VALUE.match(v):
            yield f"slurm.{key}", f"{ascii(v)} is not a valid SLURM {key} (letters, digits and ._,:@%+=/- only)"
    v = m.get("constraint")
    if isinstance(v, str) and not SLURM_CONSTRAINT.match(v):
        yield "slurm.constraint", f"{ascii(v)} is not a valid SLURM constraint expression"
    v = m.get("time")
    if isinstance(v, str) and not SLURM_TIME.match(v):
        yield "slurm.time", f"{ascii(v)} is not a SLURM time (minutes, [D-]HH:MM:SS, or UNLIMITED)"
    extra = m.get("extra")
    if isinstance(extra, dict):
        for key, value in extra.items():
            p = join("slurm.extra", str(key))
            if not isinstance(key, str) or not SLURM_OPTION.match(key):
                yield p, f"{ascii(key)} is not an sbatch option name (lowercase letters, digits and -)"
            # values are shell-quoted on their #SBATCH line (spaces are fine, control characters are not)


def unsafe_values(top: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(path, message) for names, hosts and SLURM/SSH values outside their safe character sets."""
    yield from _name("name", top.get("name"), "cluster name")
    nodes = top.get("nodes")
    for i, node in enumerate(nodes if isinstance(nodes, list) else []):
        if not isinstance(node, dict):
            continue
        p = join("nodes", i)
        yield from _name(join(p, "name"), node.get("name"), "node name")
        ssh = node.get("ssh")
        if isinstance(ssh, dict):
            user = ssh.get("user")
            if isinstance(user, str) and not SSH_USER.match(user):
                yield join(p, "ssh.user"), f"ssh user {ascii(user)} is not a valid user name"
            yield from _jump(join(p, "ssh.jump"), ssh.get("jump"))
    yield from _hosts(top, "")
    if isinstance(top.get("slurm"), dict):
        yield from _slurm(top["slurm"])


def _hosts(data: Any, path: str) -> Iterator[tuple[str, str]]:
    """Every ``host``/``prometheus_host``/``ip`` key anywhere in the document."""
    if isinstance(data, dict):
        for key, value in data.items():
            kpath = join(path, key if isinstance(key, (int, str)) else str(key))
            if key in HOST_KEYS:
                yield from _host(kpath, value, HOST_WORDS if key != "ip" else ())
            elif key not in ("env", "args", "extra"):
                yield from _hosts(value, kpath)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _hosts(value, join(path, i))
