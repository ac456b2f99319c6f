"""The launcher contract, one suite run against all three launchers with real processes:
local (subprocess), ssh (three real sshd nodes) and slurm (job steps in an allocation of the
real local SLURM cluster). Same cases, same assertions: a batch starts, polls, logs and stops as
one; one failing start never hides the others; a stopped worker starts again in place (what
`rebalance` needs); the launching shell's secrets never reach a worker.
"""

from __future__ import annotations

import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from conftest_ssh import node_access, processes_with, sshd, ssh_options  # noqa: F401
from slurm_cluster import slurm_cluster

from epdctl.launchers.base import Launcher
from epdctl.state.store import ProcessRecord

ROOT = Path(__file__).resolve().parents[1]
SLEEPER = ("import os, sys, time\n"
           "print('up', os.environ.get('CONTRACT_SECRET_TOKEN', 'no-secret'), flush=True)\n"
           "time.sleep(900)\n")
STUBBORN = ("import signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('up', flush=True)\n"
            "time.sleep(900)\n")


@dataclass
class Kit:
    launcher: Launcher
    nodes: list[str]
    logs: Path

    def rec(self, name: str, i: int, code: str, marker: str) -> ProcessRecord:
        node = self.nodes[i % len(self.nodes)]
        return ProcessRecord(name=name, role="encoder", node=node,
                             argv=["python3", "-c", code, marker], log=str(self.logs / f"{name}.log"))


@pytest.fixture(scope="module")
def slurm() -> Iterator[object]:
    yield from slurm_cluster()


@pytest.fixture(scope="module")
def sshd_port() -> int:
    return 35122


@pytest.fixture(params=["local", "ssh", "slurm"])
def kit(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Kit]:
    cdir = tmp_path / "clusters" / "contract"
    cdir.mkdir(parents=True)
    lau: Launcher
    if request.param == "local":
        from epdctl.launchers.local import LocalLauncher

        lau, nodes = LocalLauncher(cdir), ["local"]
    elif request.param == "ssh":
        from epdctl.launchers.ssh import SSHLauncher

        daemons = request.getfixturevalue("sshd")
        lau = SSHLauncher(cdir, nodes=node_access(daemons), cluster="contract",
                          options=request.getfixturevalue("ssh_options"),
                          run_root=str(tmp_path / "remote"))
        nodes = [n.name for n in daemons.nodes]
    else:
        from epdctl.launchers.slurm.launcher import SlurmLauncher
        from epdctl.topology import load_topology

        request.getfixturevalue("slurm")
        lau = SlurmLauncher(cdir, load_topology(ROOT / "topologies" / "slurm-local.yaml"))
        nodes = ["n0", "n1", "n2"]
    try:
        yield Kit(lau, nodes, cdir / "logs")
    finally:
        lau.release()
        lau.close()


def _wait_for(fn, limit: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    while not fn():
        assert time.monotonic() - t0 < limit, "condition not met in time"
        time.sleep(0.2)


def _started(kit: Kit, recs: list[ProcessRecord]) -> list[ProcessRecord]:
    res = kit.launcher.start(recs)
    res.raise_if_failed("start")
    for r in recs:
        r.handle = res.ok[r.name]
    return recs


def test_a_batch_starts_polls_logs_and_stops_as_one(kit: Kit) -> None:
    marker = f"epd-contract-{uuid.uuid4().hex}"
    recs = _started(kit, [kit.rec(f"w{i}", i, SLEEPER, marker) for i in range(3)])
    try:
        polled = kit.launcher.poll(recs)
        assert polled.all_ok and all(s.alive for s in polled.ok.values())
        _wait_for(lambda: all("up" in kit.launcher.logs(r, 5) for r in recs))
        assert len(processes_with(marker)) >= 3
    finally:
        stopped = kit.launcher.stop(recs, grace=5)
    assert stopped.all_ok and sorted(stopped.ok) == ["w0", "w1", "w2"]
    assert not any(s.alive for s in kit.launcher.poll(recs).ok.values())
    _wait_for(lambda: processes_with(marker) == [])


def test_one_failing_worker_never_hides_the_others(kit: Kit) -> None:
    marker = f"epd-contract-{uuid.uuid4().hex}"
    dies = "import sys; print('loading', flush=True); sys.exit('error: bad checkpoint /nope')"
    good, bad = kit.rec("good", 0, SLEEPER, marker), kit.rec("bad", 1, dies, marker)
    res = kit.launcher.start([good, bad])
    try:
        assert "good" in res.ok
        good.handle = res.ok["good"]
        if "bad" in res.failed:  # local and ssh see it die within their settle time
            why = str(res.failed["bad"])
        else:  # a SLURM step is listed before its task runs: poll finds it dead
            bad.handle = res.ok["bad"]
            _wait_for(lambda: not kit.launcher.poll([bad]).ok["bad"].alive)
            why = kit.launcher.poll([bad]).ok["bad"].tail
        assert "bad checkpoint /nope" in why and "loading" in why
        assert kit.launcher.poll([good]).ok["good"].alive
    finally:
        assert kit.launcher.stop([good], grace=5).all_ok


def test_a_stopped_worker_starts_again_in_place_and_the_others_keep_running(kit: Kit) -> None:
    marker = f"epd-contract-{uuid.uuid4().hex}"
    recs = _started(kit, [kit.rec(f"w{i}", i, SLEEPER, marker) for i in range(2)])
    try:
        assert kit.launcher.stop(recs[:1], grace=5).all_ok
        polled = kit.launcher.poll(recs).ok
        assert not polled["w0"].alive and polled["w1"].alive
        again = kit.rec("w0", 0, SLEEPER, marker)
        _started(kit, [again])
        assert again.handle != recs[0].handle
        assert all(s.alive for s in kit.launcher.poll([again, recs[1]]).ok.values())
        recs[0] = again
    finally:
        assert kit.launcher.stop(recs, grace=5).all_ok
    _wait_for(lambda: processes_with(marker) == [])


def test_a_worker_ignoring_sigterm_is_killed_after_the_grace(kit: Kit) -> None:
    marker = f"epd-contract-{uuid.uuid4().hex}"
    rec = _started(kit, [kit.rec("stubborn", 0, STUBBORN, marker)])[0]
    _wait_for(lambda: "up" in kit.launcher.logs(rec, 5))
    t0 = time.monotonic()
    assert kit.launcher.stop([rec], grace=1).all_ok
    assert time.monotonic() - t0 < 45
    _wait_for(lambda: processes_with(marker) == [])


def test_a_secret_of_the_launching_shell_never_reaches_a_worker(
        kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTRACT_SECRET_TOKEN", "shell-only-5c1e")
    marker = f"epd-contract-{uuid.uuid4().hex}"
    rec = _started(kit, [kit.rec("envy", 0, SLEEPER, marker)])[0]
    try:
        _wait_for(lambda: "up" in kit.launcher.logs(rec, 5))
        assert "up no-secret" in kit.launcher.logs(rec, 5)
        procs = [p for p in processes_with(marker) if "python" in p.name()]
        assert procs
        for p in procs:
            environ = Path(f"/proc/{p.pid}/environ").read_bytes()
            assert b"shell-only-5c1e" not in environ and b"CONTRACT_SECRET_TOKEN" not in environ
            assert b"PATH=" in environ
    finally:
        assert kit.launcher.stop([rec], grace=5).all_ok


def test_how_nodes_are_reached_and_what_holds_the_processes(kit: Kit) -> None:
    """What `up`'s preflight, `check` and `status` ask a launcher instead of branching on its
    name: whether its nodes exist before anything starts, how to run the node agent on each
    (the launcher's own way: this machine, its SSH connections), and what holds the processes
    (a SLURM allocation: its state; nothing for local and ssh)."""
    lau = kit.launcher
    runners = lau.node_runners(kit.nodes)
    assert sorted(runners) == sorted(kit.nodes)
    if lau.nodes_known:
        for node, r in runners.items():
            got = r.run([r.python, "-c", "print('reached', 6 * 7)"], timeout=60)
            assert (got.rc, got.stdout.strip()) == (0, "reached 42"), (node, got)
    else:
        assert lau.name == "slurm"  # the allocation chooses the nodes when the job runs
    marker = f"epd-contract-{uuid.uuid4().hex}"
    recs = _started(kit, [kit.rec("w0", 0, SLEEPER, marker)])
    try:
        held = lau.holding(recs)
        if lau.name == "slurm":
            assert held is not None and (held.state, held.detail) == ("RUNNING", "")
            assert held.job == recs[0].handle.job  # type: ignore[union-attr]
        else:
            assert held is None
    finally:
        assert lau.stop(recs, grace=5).all_ok
