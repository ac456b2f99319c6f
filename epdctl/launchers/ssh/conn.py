"""SSH connections to cluster nodes (paramiko), with strict host-key checking.

Why strict by default: epdctl starts processes as the user on every node, so talking to an
impostor would hand it the cluster. Keys are checked against known_hosts with a reject policy;
``accept_new_host_keys`` trusts (and records) keys of hosts never seen before, but a key that
differs from a recorded one is always refused, as OpenSSH's ``accept-new`` does.

Where to connect comes from ``epdctl.launchers.ssh.config`` (topology, then ~/.ssh/config). Errors are
``SSHError`` with a ``[node]`` prefix and say what to do; no key material or secret is ever
put in a message or a log.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import paramiko

from epdctl.launchers.ssh.config import SSHError, SSHOptions, SSHTarget, host_key_name, resolve

log = logging.getLogger(__name__)
_KNOWN_HOSTS_LOCK = threading.Lock()


@dataclass(frozen=True)
class CommandResult:
    rc: int
    stdout: str
    stderr: str


class UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey, other_types: list[str]):
        super().__init__(hostname)
        self.hostname = hostname
        self.key = key
        self.other_types = other_types


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Reject unknown keys, or (``accept``) trust and append them to known_hosts."""

    def __init__(self, accept: bool, save_to: Path | None):
        self.accept = accept
        self.save_to = save_to

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        recorded = client.get_host_keys().lookup(hostname)
        if not self.accept or recorded:
            # A host recorded with a key of another type is not "new": refuse like a mismatch.
            raise UnknownHostKey(hostname, key, other_types=sorted(recorded or ()))
        client.get_host_keys().add(hostname, key.get_name(), key)
        if self.save_to is not None:
            line = paramiko.hostkeys.HostKeyEntry([hostname], key).to_line() or ""
            with _KNOWN_HOSTS_LOCK:
                self.save_to.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                with open(self.save_to, "a") as f:
                    f.write(line)
        log.info("trusted new host key %s %s for %s", key.get_name(),
                 key.fingerprint, hostname)


def _load_known_hosts(client: paramiko.SSHClient, files: list[Path]) -> None:
    for path in files:
        if path.is_file():
            try:
                client.load_host_keys(str(path))
            except (OSError, paramiko.SSHException) as e:
                raise SSHError(f"cannot read known_hosts file {path}: {e}") from e


class SSHConnection:
    """One logged-in session to a node (through its jump hosts, if any). Use as a context."""

    def __init__(self, target: SSHTarget, options: SSHOptions | None = None):
        self.options = options or SSHOptions()
        self.target = resolve(target, self.options)
        self.node = target.node
        self._client: paramiko.SSHClient | None = None
        self._jump: SSHConnection | None = None
        self._lock = threading.Lock()  # threads of a fan-out share one connection per node

    def __enter__(self) -> "SSHConnection":
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def where(self) -> str:
        t = self.target
        return f"{t.user}@{host_key_name(t.host, t.port or 22)}"

    def open(self) -> None:
        with self._lock:
            if self._client is None:
                self._open()

    def _open(self) -> None:
        t, o = self.target, self.options
        port = t.port or 22
        sock = None
        if t.jump is not None:
            # Already resolved against ssh config; do not look it up a second time.
            self._jump = SSHConnection(replace(t.jump, node=f"{self.node} via {t.jump.host}"),
                                       replace(o, ssh_config=None))
            self._jump.open()
            sock = self._jump.open_tunnel(t.host, port)
        known = [Path(p).expanduser() for p in o.known_hosts]
        client = paramiko.SSHClient()
        _load_known_hosts(client, known)
        client.set_missing_host_key_policy(
            _HostKeyPolicy(o.accept_new_host_keys, known[0] if known else None))
        try:
            client.connect(
                t.host, port=port, username=t.user, key_filename=t.key,
                look_for_keys=t.key is None, allow_agent=True, timeout=o.connect_timeout,
                banner_timeout=o.connect_timeout, auth_timeout=o.connect_timeout,
                channel_timeout=o.connect_timeout, sock=sock,
            )
        except BaseException as e:
            client.close()
            self._close_jump()
            raise self._explain(e, known) from None
        self._client = client
        log.debug("[%s] connected to %s", self.node, self.where)

    def _explain(self, e: BaseException, known: list[Path]) -> BaseException:
        """Turn a paramiko/socket failure into one actionable SSHError."""
        t = self.target
        port = t.port or 22
        where = f"{t.host}:{port}"
        name = host_key_name(t.host, port)
        files = ", ".join(str(p) for p in known) or "(none)"
        p = f"[{self.node}]"
        # ssh-keygen -R edits ~/.ssh/known_hosts unless told which file holds the entry
        kf = f" -f '{known[0]}'" if known and str(known[0]) != str(
            Path("~/.ssh/known_hosts").expanduser()) else ""
        if isinstance(e, UnknownHostKey) and e.other_types:
            return SSHError(
                f"{p} HOST KEY MISMATCH for {name}: the server offered {e.key.get_name()} "
                f"{e.key.fingerprint} but {files} records only {', '.join(e.other_types)} "
                f"key(s) for it; refusing. If the node's keys really changed, remove the old "
                f"entry with ssh-keygen{kf} -R '{name}'")
        if isinstance(e, UnknownHostKey):
            return SSHError(
                f"{p} unknown host key for {name} ({e.key.get_name()} {e.key.fingerprint}); "
                f"it is not in {files}. Check the fingerprint with the node's admin, then add it "
                f"(ssh-keyscan -p {port} {t.host} >> {known[0] if known else '~/.ssh/known_hosts'})"
                f" or rerun with --accept-new-host-keys to trust it on first use")
        if isinstance(e, paramiko.BadHostKeyException):
            return SSHError(
                f"{p} HOST KEY MISMATCH for {name}: the server offered {e.key.get_name()} "
                f"{e.key.fingerprint} but {files} records {e.expected_key.fingerprint}. "
                f"Someone may be intercepting the connection, or the node was reinstalled; "
                f"if you are sure, remove the old entry with ssh-keygen{kf} -R '{name}'. "
                f"epdctl never replaces a recorded key")
        if isinstance(e, paramiko.PasswordRequiredException):
            return SSHError(f"{p} identity file {t.key} is encrypted; load it into ssh-agent "
                            f"(ssh-add {t.key}) and remove 'key' from the topology")
        if isinstance(e, paramiko.AuthenticationException):
            key = f"identity file {t.key}" if t.key else "the agent and default keys"
            return SSHError(f"{p} authentication failed for {t.user}@{where} with {key}; "
                            f"check that its public key is in the node's authorized_keys")
        if isinstance(e, FileNotFoundError):
            return SSHError(f"{p} identity file {t.key} does not exist; fix ssh.key for this node")
        if isinstance(e, socket.gaierror):
            return SSHError(f"{p} cannot resolve host name {t.host!r}: {e.strerror}")
        if isinstance(e, (socket.timeout, TimeoutError)):
            return SSHError(f"{p} cannot reach {where}: no answer within "
                            f"{self.options.connect_timeout:.0f}s; check the address and firewall")
        if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
            return SSHError(f"{p} cannot connect to {where}: connection refused; "
                            f"is sshd running there and is the port right?")
        if isinstance(e, OSError):
            return SSHError(f"{p} cannot connect to {where}: {e.strerror or e}")
        if isinstance(e, paramiko.SSHException):
            return SSHError(f"{p} SSH handshake with {where} failed: {e}")
        return e

    def open_tunnel(self, host: str, port: int) -> paramiko.Channel:
        """A direct-tcpip channel from this (jump) host to host:port, used as the next socket."""
        assert self._client is not None
        transport = self._client.get_transport()
        assert transport is not None
        try:
            return transport.open_channel("direct-tcpip", (host, port), ("127.0.0.1", 0),
                                          timeout=self.options.connect_timeout)
        except (paramiko.SSHException, OSError) as e:
            self.close()
            raise SSHError(f"[{self.node}] cannot open a tunnel from {self.target.host} to "
                           f"{host}:{port}: {e}") from None

    def run(self, command: str, stdin: str | bytes | None = None,
            timeout: float | None = None) -> CommandResult:
        """Run ``command`` with the login shell; feed ``stdin``; collect output and status."""
        self.open()
        assert self._client is not None
        timeout = self.options.command_timeout if timeout is None else timeout
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise SSHError(f"[{self.node}] connection to {self.where} was closed")
        try:
            chan = transport.open_session(timeout=self.options.connect_timeout)
            chan.exec_command(command)
            if stdin is not None:
                chan.sendall(stdin.encode() if isinstance(stdin, str) else stdin)
            chan.shutdown_write()
            return self._collect(chan, timeout)
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise SSHError(f"[{self.node}] running a command on {self.where} failed: {e}") from None

    def _collect(self, chan: paramiko.Channel, timeout: float) -> CommandResult:
        out: list[bytes] = []
        err: list[bytes] = []
        deadline = time.monotonic() + timeout
        try:
            while True:
                while chan.recv_ready():
                    out.append(chan.recv(65536))
                while chan.recv_stderr_ready():
                    err.append(chan.recv_stderr(65536))
                if chan.exit_status_ready() and not chan.recv_ready() \
                        and not chan.recv_stderr_ready():
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SSHError(f"[{self.node}] command on {self.where} did not finish "
                                   f"within {timeout:.0f}s")
                select.select([chan], [], [], min(left, 1.0))
            rc = chan.recv_exit_status()
        finally:
            chan.close()
        return CommandResult(rc, b"".join(out).decode(errors="replace"),
                             b"".join(err).decode(errors="replace"))

    def session(self, command: str) -> paramiko.Channel:
        """``command`` started on a channel of its own, stdin open: a long-lived agent, or a job
        whose caller writes stdin and reads stdout by line."""
        self.open()
        assert self._client is not None
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise SSHError(f"[{self.node}] connection to {self.where} was closed")
        try:
            chan = transport.open_session(timeout=self.options.connect_timeout)
            chan.exec_command(command)
            return chan
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise SSHError(f"[{self.node}] starting a command on {self.where} failed: {e}") from None

    def stream(self, command: str, idle_timeout: float | None = None) -> "paramiko.ChannelFile":
        """Start ``command`` and return its stdout as a file (for following a log).

        Reading raises ``socket.timeout`` after ``idle_timeout`` seconds without output.
        """
        self.open()
        assert self._client is not None
        _, out, _ = self._client.exec_command(command, timeout=idle_timeout)
        return out

    def _close_jump(self) -> None:
        if self._jump is not None:
            self._jump.close()
            self._jump = None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        self._close_jump()


@dataclass
class ConnectionPool:
    """One lazily opened connection per node, shared by the threads of a fan-out."""

    options: SSHOptions = field(default_factory=SSHOptions)
    _conns: dict[str, SSHConnection] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, target: SSHTarget) -> SSHConnection:
        with self._lock:
            conn = self._conns.get(target.node)
            if conn is None:
                conn = self._conns[target.node] = SSHConnection(target, self.options)
        conn.open()
        return conn

    def close(self) -> None:
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for c in conns:
            c.close()
