"""Fixtures for tests that need real SSH nodes (real sshd on 127.0.0.2, .3, .4, ...).

Not a ``conftest.py`` (that name belongs to other suites); test modules import what they use:
``from conftest_ssh import sshd, ssh_options, hermetic_ssh, ...``. A module picks its own sshd
port by overriding the ``sshd_port`` fixture, so suites running at the same time never share
daemons. Every test is isolated from the user's ``~/.ssh`` (config and known_hosts), as
Fabric's test suite is.
"""

from __future__ import annotations

import sys
import time
from typing import Iterator

import psutil
import pytest

from sshd_nodes import SshdNodes

from epdctl.launchers.ssh.nodes import NodeAccess
from epdctl.launchers.ssh.conn import SSHOptions, SSHTarget

NODE_COUNT = 3


@pytest.fixture(scope="module")
def sshd_port() -> int:
    return 35022


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory, sshd_port: int) -> Iterator[SshdNodes]:
    """Three real sshd daemons (node0..node2 on 127.0.0.2..4), stopped after the module."""
    nodes = SshdNodes(tmp_path_factory.mktemp("sshd"), NODE_COUNT, port=sshd_port)
    nodes.start()
    try:
        yield nodes
    finally:
        nodes.stop()


@pytest.fixture
def hermetic_ssh(monkeypatch: pytest.MonkeyPatch, sshd: SshdNodes) -> SshdNodes:
    """Point launchers built from the environment at the test known_hosts; no ~/.ssh/config."""
    monkeypatch.setenv("EPDCTL_SSH_CONFIG", "")
    monkeypatch.setenv("EPDCTL_KNOWN_HOSTS", str(sshd.known_hosts))
    monkeypatch.setenv("EPDCTL_SSH_TIMEOUT", "10")
    monkeypatch.delenv("EPDCTL_SSH_ACCEPT_NEW_HOST_KEYS", raising=False)
    return sshd


@pytest.fixture
def ssh_options(sshd: SshdNodes) -> SSHOptions:
    return SSHOptions(known_hosts=(str(sshd.known_hosts),), ssh_config=None, connect_timeout=10)


def target(sshd: SshdNodes, i: int, **changes: object) -> SSHTarget:
    n = sshd.nodes[i]
    fields = dict(node=n.name, host=n.host, user=sshd.user, port=n.port, key=str(sshd.client_key))
    fields.update(changes)
    return SSHTarget(**fields)  # type: ignore[arg-type]


def node_access(sshd: SshdNodes, setup: tuple[str, ...] = (),
                python: str = sys.executable) -> dict[str, NodeAccess]:
    """Every test node, logging in with the test key and running this interpreter."""
    return {n.name: NodeAccess(n.name, target(sshd, i), setup, python)
            for i, n in enumerate(sshd.nodes)}


def processes_with(marker: str) -> list[psutil.Process]:
    """Live processes whose command line contains ``marker`` (what a test started; not the
    supervisor that runs it, whose command line names it too)."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = " ".join(p.info["cmdline"] or ())
            if "supervise" in cmd:
                continue
            if p.info["status"] != psutil.STATUS_ZOMBIE and marker in cmd:
                found.append(p)
        except psutil.Error:
            continue
    return found


def wait_dead(pid: int, limit: float = 60.0) -> None:
    """Until ``pid`` is gone or a zombie (a killed orphan waits for init to reap it); the
    limit only stops a hung test."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} did not die")
