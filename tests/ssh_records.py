"""What the ssh launcher tests build their processes from: a findable sleeper, a launcher over
the test's sshd nodes, a record as `up` makes it, and a start that fills in the handles."""

from __future__ import annotations

import sys
from pathlib import Path

from conftest_ssh import node_access
from sshd_nodes import SshdNodes

from epdctl.launchers.ssh import SSHLauncher
from epdctl.launchers.ssh.conn import SSHOptions
from epdctl.state.store import ProcessRecord


def sleeper(marker: str) -> tuple[str, ...]:
    """A process that runs until stopped; ``marker`` makes it findable with psutil."""
    return (sys.executable, "-c", "import sys, time; print('up', flush=True); time.sleep(900)",
            marker)


def launcher(sshd: SshdNodes, opts: SSHOptions, tmp_path: Path, **kw) -> SSHLauncher:
    nodes = kw.pop("nodes", None) or node_access(sshd, kw.pop("setup", ()))
    return SSHLauncher(tmp_path / "clusters" / "t", nodes=nodes, cluster="t",
                       options=opts, run_root=str(tmp_path / "remote"), **kw)


def spec(name: str, role: str, node: str, argv: tuple[str, ...], tmp_path: Path,
         env: dict[str, str] | None = None) -> ProcessRecord:
    """A record as `up` makes it: its log is the local mirror in the run folder."""
    return ProcessRecord(name, role, node, list(argv), env=env or {},
                         log=str(tmp_path / "clusters" / "t" / "logs" / f"{name}.log"))


def started(lau: SSHLauncher, recs: list[ProcessRecord]):  # type: ignore[no-untyped-def]
    """Start ``recs``; the handles go into the records that started. Returns the Results."""
    res = lau.start(recs)
    for r in recs:
        if r.name in res.ok:
            r.handle = res.ok[r.name]
    return res
