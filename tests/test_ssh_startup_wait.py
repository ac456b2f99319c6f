"""`up`'s wait over SSH, real sshd daemons on 127.0.0.2..4: a worker loading on node1 is shown
with the last meaningful line of its log (read by the node's agent in the poll), and when node1
stops answering (its sshd and every session of it gone; the worker itself keeps running) the
start fails naming node1 and the worker waiting there, long before the worker's budget."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
import pytest

from conftest_ssh import processes_with, ssh_options, sshd, sshd_port  # noqa: F401  (fixtures)
from ssh_records import launcher
from sshd_nodes import SSHD, SshdNodes

from epdctl.errors import LaunchError
from epdctl.orchestrate.lifecycle import NODE_SILENT_S, BringUp, Event
from epdctl.render.plan import ROUTER_TYPES, ProcessSpec
from epdctl.state.store import ClusterDir, ClusterState
from epdctl.topology.model import Role

DUMMY = str(Path(__file__).parent / "e2e" / "dummy_worker.py")
BASE = 31930


@dataclass
class Plan:
    workers: list[ProcessSpec]
    router: ProcessSpec | None = None


def _spec(name: str, role: str, node: str, port: int, *extra: str) -> ProcessSpec:
    return ProcessSpec(name=name, role=Role(role), node=node, host="127.0.0.1",
                       url=f"http://127.0.0.1:{port}", ports={"http": port},
                       argv=(sys.executable, DUMMY, str(port), role, *extra), env={},
                       worker=name, router_type=ROUTER_TYPES.get(Role(role)))


def _silence(nodes: SshdNodes, i: int) -> None:
    """node i stops answering: its sshd and its sessions end (the workers, own sessions, stay)."""
    daemon = psutil.Process(nodes.nodes[i].pid)
    for p in [*daemon.children(recursive=True), daemon]:
        try:
            if p.name().startswith("sshd"):
                p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass


def _revive(nodes: SshdNodes, i: int) -> None:
    n = nodes.nodes[i]
    pid_file = nodes.root / n.name / "sshd.pid"
    pid_file.unlink(missing_ok=True)
    subprocess.run([SSHD, "-f", str(nodes.root / n.name / "sshd_config"), "-E", str(n.log)],
                   check=True, capture_output=True)
    deadline = time.monotonic() + 10
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    nodes.nodes[i] = replace(n, pid=int(pid_file.read_text().split()[0]))


def test_loading_lines_over_ssh_and_a_silent_node_named(sshd, ssh_options, tmp_path: Path,  # noqa: F811
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path))
    cdir = ClusterDir("t")
    st = ClusterState(name="t", topology="hand-built", launcher="ssh", model="dummy")
    cdir.save(st)
    lau = launcher(sshd, ssh_options, tmp_path)
    plan = Plan([_spec("encoder-0", "encoder", "node0", BASE + 1),
                 _spec("decode-0", "decode", "node1", BASE + 2, "--load-seconds", "600")])
    events: list[Event] = []
    silenced: list[float] = []

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(e.kind == "worker" and "checkpoint shards" in e.detail for e in list(events)):
                _silence(sshd, 1)
                silenced.append(time.monotonic())
                return
            time.sleep(0.2)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        with pytest.raises(LaunchError) as e:
            BringUp(lau, cdir, st, timeout=1800, on_event=events.append).run(plan)
        took = time.monotonic() - silenced[0]
        msg = str(e.value)
        assert msg.startswith("node node1 stopped answering") and "decode-0 was starting on it" in msg, msg
        assert "budget" not in msg
        assert NODE_SILENT_S <= took < NODE_SILENT_S + 30, took
        shown = [ev.detail for ev in events if ev.kind == "worker"]
        assert any(d.startswith("[node1/decode-0] Loading safetensors checkpoint shards: ") for d in shown)
        assert any(ev.kind == "node" and ev.stage == "node1" for ev in events)
    finally:
        lau.close()
        _revive(sshd, 1)
        again = launcher(sshd, ssh_options, tmp_path)
        try:
            again.stop(st.processes, grace=5)
        finally:
            again.close()
    deadline = time.monotonic() + 10
    while _ours() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _ours() == []


def _ours() -> list[psutil.Process]:
    return [p for p in processes_with(DUMMY) if f"{DUMMY} {BASE + 1}" in " ".join(p.cmdline())
            or f"{DUMMY} {BASE + 2}" in " ".join(p.cmdline())]
