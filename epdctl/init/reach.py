"""Which machines `epdctl init` asks, and how: SSH (hosts given, or ``Host`` entries of the ssh
config matching a pattern) or SLURM (the current allocation's nodes, one ``srun`` step each).

Each node runs the preflight agent's ``facts`` mode, the same probes `epdctl check` reads. The
agent is sent as source (``python3 -c``), because before `init` nothing needs epdctl installed on
the nodes: the agent imports only the standard library.
"""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from epdctl.errors import EpdctlError
from epdctl.launchers.ssh.fanout import fanout
from epdctl.node import preflight_agent
from epdctl.preflight.records import Facts
from epdctl.preflight.runners import LocalRunner, NodeRunner, SSHRunner

def _standalone_agent() -> str:
    """The check agent as one self-contained script: the epdctl.node modules it imports (standard
    library only) are inlined, so a node needs Python 3 but not epdctl."""
    out = []
    for ln in Path(preflight_agent.__file__).read_text(encoding="utf-8").split("\n"):
        m = re.match(r"from epdctl\.node(?:\.(\w+))? import ([\w, ]+)", ln)
        if not m:
            out.append(ln)
            continue
        names = [n.strip() for n in m.group(2).split("#")[0].split(",")]
        for mod in [m.group(1)] if m.group(1) else names:
            helper = (Path(preflight_agent.__file__).parent / f"{mod}.py").read_text(encoding="utf-8")
            out.append("import sys as _sys, types as _types\n"
                       f"{mod} = _types.ModuleType({mod!r}); _sys.modules[{mod!r}] = {mod}\n"
                       f"exec(compile({helper!r}, '{mod}.py', 'exec'), {mod}.__dict__)")
        if m.group(1):
            out.append(f"from {m.group(1)} import {m.group(2)}")
    return "\n".join(out)


AGENT_SOURCE = _standalone_agent()
FACTS_TIMEOUT = 90.0
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")


@dataclass(frozen=True)
class Found:
    """One node as `init` found it: its facts, or why there are none."""

    name: str
    host: str
    facts: Facts | None
    error: str | None = None
    hostname: str | None = None


def split_hosts(text: str) -> list[str]:
    hosts = [h.strip() for h in text.split(",") if h.strip()]
    if not hosts:
        raise EpdctlError("--hosts is empty; give machines as a,b,c (names or addresses, user@host:port allowed)")
    if len(set(hosts)) != len(hosts):
        raise EpdctlError(f"--hosts lists a machine twice: {text}")
    return hosts


def ssh_config_hosts(pattern: str, config: str | None) -> list[str]:
    """``Host`` names (no wildcards) in the ssh config that match the shell-style ``pattern``."""
    import paramiko

    path = Path(config or "~/.ssh/config").expanduser()
    try:
        names = paramiko.SSHConfig.from_path(str(path)).get_hostnames()
    except (OSError, paramiko.ConfigParseError) as e:
        raise EpdctlError(f"cannot read ssh config {path} ({e}); pass --hosts instead") from None
    hosts = sorted(n for n in names if not any(c in n for c in "*?!") and fnmatch.fnmatchcase(n, pattern))
    if not hosts:
        raise EpdctlError(f"no Host entry in {path} matches {pattern!r} (found: {', '.join(sorted(names)) or 'none'})")
    return hosts


def slurm_nodes(env: Mapping[str, str]) -> list[str]:
    """The allocation's nodes: ``scontrol show hostnames $SLURM_JOB_NODELIST``."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise EpdctlError("--slurm runs inside an allocation (SLURM_JOB_NODELIST is not set); start it with "
                          "`salloc -N <nodes> epdctl init --slurm ...` or from an sbatch script")
    try:
        p = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EpdctlError(f"cannot run scontrol to expand {nodelist!r}: {e}") from None
    names = p.stdout.split()
    if p.returncode != 0 or not names:
        raise EpdctlError(f"scontrol show hostnames {nodelist} failed: {p.stderr.strip() or 'no output'}")
    return names


def node_names(hosts: Sequence[str]) -> dict[str, str]:
    """host -> node name: the host itself when it is a plain name, else n0, n1, ..."""
    out: dict[str, str] = {}
    for i, h in enumerate(hosts):
        bare = h.rpartition("@")[2].split(":")[0]
        name = bare.split(".")[0] if _NAME.match(bare.split(".")[0]) else f"n{i}"
        out[h] = name if name not in out.values() else f"n{i}"
    return out


def ssh_runners(hosts: Sequence[str], names: Mapping[str, str], options: object, python: str,
                setup: tuple[str, ...], targets: Mapping[str, object] | None = None
                ) -> tuple[dict[str, NodeRunner], object]:
    """(runners, the connection pool to close afterwards); host keys are checked as `up` does."""
    from epdctl.launchers.ssh.config import parse_destination
    from epdctl.launchers.ssh.conn import ConnectionPool

    pool = ConnectionPool(options)  # type: ignore[arg-type]
    out: dict[str, NodeRunner] = {}
    for h in hosts:
        target = targets[h] if targets else parse_destination(h, names[h])
        out[names[h]] = SSHRunner(names[h], _Lazy(pool, target), python=python, setup=setup)
    return out, pool


def slurm_runners(nodes: Sequence[str], python: str, setup: tuple[str, ...]) -> dict[str, NodeRunner]:
    """One srun step per node; setup lines run in a shell before the agent."""
    out: dict[str, NodeRunner] = {}
    for n in nodes:
        prefix: tuple[str, ...] = ("srun", "--nodes=1", "--ntasks=1", f"--nodelist={n}", "--overlap", "--quiet")
        if setup:
            prefix += ("bash", "-c", " && ".join([*setup, 'exec "$@"']), "epdctl-init")
        out[n] = LocalRunner(n, prefix=prefix, python=python)
    return out


class _Lazy:
    """Connects on first use inside the fan-out thread, so one dead node never blocks the others."""

    def __init__(self, pool: object, target: object):
        self.pool, self.target = pool, target

    def run(self, command: str, timeout: float | None = None) -> object:
        return self.pool.get(self.target).run(command, timeout=timeout)  # type: ignore[attr-defined]


def _facts(name: str, runner: NodeRunner) -> tuple[Facts, str | None]:
    res = runner.run([runner.python, "-c", AGENT_SOURCE, "facts"], timeout=FACTS_TIMEOUT)
    for line in reversed(res.stdout.strip().splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and "probes" in doc:
            return Facts(name, doc["probes"], doc.get("versions", {}), {}), doc.get("hostname")
    err = (res.stderr.strip().splitlines() or [res.stdout.strip() or "no output"])[-1]
    raise EpdctlError(f"the agent gave no facts (exit {res.rc}): {err}; is {runner.python} on the node?")


def gather(runners: Mapping[str, NodeRunner], hosts: Mapping[str, str]) -> list[Found]:
    """Facts of every node, in parallel; a node that fails is reported, never hides the others."""
    got = fanout(dict(runners), _facts)
    out = []
    for name in runners:
        if name in got.ok:
            facts, hostname = got.ok[name]
            out.append(Found(name, hosts[name], facts, hostname=hostname))
        else:
            out.append(Found(name, hosts[name], None, str(got.failed[name])))
    return out

