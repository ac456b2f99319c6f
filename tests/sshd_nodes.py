"""Real sshd daemons on loopback aliases (127.0.0.2, 127.0.0.3, ...) acting as cluster nodes.

Linux routes all of 127/8 to ``lo``, so each daemon listening on its own address is a distinct
"node" to paramiko, with its own host key, while needing no network setup. Each daemon has its
own config, host key, pid file and log under ``root``; one client key is authorised on all of
them and a ``known_hosts`` file lists every node's host key (``[127.0.0.x]:PORT`` form).

Used by the session fixtures in ``tests/conftest_ssh.py`` and by
``benchmarks/bench_ssh_fanout.py``. Requires ``/usr/sbin/sshd`` (Debian: openssh-server) and
``ssh-keygen``; sshd needs root to switch users, so the nodes log in as the current user (root
in CI).
"""

from __future__ import annotations

import getpass
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"

_CONFIG = """\
Port {port}
ListenAddress {host}
HostKey {host_key}
PidFile {pid_file}
AuthorizedKeysFile {authorized_keys}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
MaxStartups 200:30:400
MaxSessions 100
LogLevel VERBOSE
"""


class SshdUnavailable(RuntimeError):
    """sshd or ssh-keygen is not installed (install openssh-server)."""


@dataclass(frozen=True)
class SshNode:
    """One running sshd: its address, port, pid and the host key it presents."""

    name: str
    host: str
    port: int
    pid: int
    host_key: Path
    host_key_pub: str  # "ssh-ed25519 AAAA..."
    log: Path


def sshd_available() -> bool:
    return os.path.exists(SSHD) and shutil.which("ssh-keygen") is not None


def keygen(path: Path) -> str:
    """Create an ed25519 key pair without passphrase at ``path``; return the public line."""
    if path.exists():
        path.unlink()
    pub = Path(f"{path}.pub")
    if pub.exists():
        pub.unlink()
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "epdctl-test", "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return " ".join(pub.read_text().split()[:2])


def known_hosts_line(host: str, port: int, pub: str) -> str:
    where = host if port == 22 else f"[{host}]:{port}"
    return f"{where} {pub}\n"


def _wait_listening(host: str, port: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


class SshdNodes:
    """Start/stop ``count`` sshd daemons on 127.0.0.<first>.. at ``port``.

    ``nodes`` lists the running daemons; ``client_key`` logs in to all of them;
    ``known_hosts`` holds all their host keys; ``user`` is the login name. ``extra_config``
    is appended to every daemon's sshd_config (e.g. ``AllowTcpForwarding no``).
    """

    def __init__(self, root: Path, count: int, port: int = 35022, first: int = 2,
                 extra_config: str = "", disks: dict[str, dict[str, str]] | None = None):
        if not sshd_available():
            raise SshdUnavailable(
                f"{SSHD} or ssh-keygen not found; install openssh-server (apt-get install -y openssh-server)"
            )
        self.root = Path(root)
        self.count = count
        self.port = port
        self.first = first
        self.extra_config = extra_config
        # node name -> {folder: tmpfs size}: that node's own "local disk" at folder. The node's
        # sshd (and all it starts) runs in its own mount namespace where each folder is a
        # private tmpfs of that size, as every machine of a cluster has its own /local/nvme.
        self.disks = disks or {}
        self.user = getpass.getuser()
        self.nodes: list[SshNode] = []
        self.client_key = self.root / "client_key"
        self.known_hosts = self.root / "known_hosts"

    def start(self, timeout: float = 30.0) -> list[SshNode]:
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation dir
        client_pub = keygen(self.client_key)
        authorized = self.root / "authorized_keys"
        authorized.write_text(client_pub + "\n")
        os.chmod(authorized, 0o600)
        lines = []
        try:
            for i in range(self.count):
                node = self._start_one(f"node{i}", f"127.0.0.{self.first + i}")
                self.nodes.append(node)
                lines.append(known_hosts_line(node.host, node.port, node.host_key_pub))
            self.known_hosts.write_text("".join(lines))
            deadline = time.monotonic() + timeout
            for node in self.nodes:
                if not _wait_listening(node.host, node.port, deadline):
                    raise RuntimeError(f"sshd for {node.name} did not listen on {node.host}:{node.port}; see {node.log}")
        except BaseException:
            self.stop()
            raise
        return self.nodes

    def _start_one(self, name: str, host: str) -> SshNode:
        d = self.root / name
        d.mkdir(exist_ok=True)
        host_key = d / "ssh_host_ed25519_key"
        pub = keygen(host_key)
        pid_file = d / "sshd.pid"
        log = d / "sshd.log"
        conf = d / "sshd_config"
        conf.write_text(
            _CONFIG.format(
                port=self.port,
                host=host,
                host_key=host_key,
                pid_file=pid_file,
                authorized_keys=self.root / "authorized_keys",
            )
            + self.extra_config
        )
        # Without -D sshd daemonizes after binding, so returning means it is listening (or failed).
        argv = [SSHD, "-f", str(conf), "-E", str(log)]
        if self.disks.get(name):
            mounts = []
            for folder, size in self.disks[name].items():
                os.makedirs(folder, exist_ok=True)
                mounts.append(f"mount -t tmpfs -o size={size} epd-{name} {shlex.quote(folder)}")
            argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                    " && ".join([*mounts, "exec " + shlex.join(argv)])]
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"sshd for {name} failed to start ({proc.returncode}): {proc.stderr.strip()} {log}")
        # The daemon writes its pid file after forking; wait for it.
        deadline = time.monotonic() + 10
        while not pid_file.exists() or not pid_file.read_text().strip():
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd for {name} wrote no pid file {pid_file}; see {log}")
            time.sleep(0.02)
        pid = int(pid_file.read_text().split()[0])
        return SshNode(name, host, self.port, pid, host_key, pub, log)

    def on_node(self, name: str, *argv: str) -> subprocess.CompletedProcess[str]:
        """Run argv in node ``name``'s mount namespace (what its own disks hold)."""
        pid = next(n.pid for n in self.nodes if n.name == name)
        return subprocess.run(["nsenter", "-t", str(pid), "-m", "--", *argv], capture_output=True, text=True,
                              timeout=60)

    def stop(self) -> None:
        """Stop every daemon this object started (and only those)."""
        for node in self.nodes:
            _kill(node.pid)
        self.nodes = []

    def __enter__(self) -> "SshdNodes":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _alive(pid: int) -> bool:
    """True if ``pid`` runs and is not a zombie (a daemon's zombie waits for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill(pid: int, grace: float = 5.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
