"""SSH and local connections: the only module that imports fabric and paramiko.

Every command is a POSIX sh script sent on stdin to ``sh -s`` (through ``sudo`` when the login user
is not root), so nothing a script contains, secrets included, appears in a process list. stderr is
merged into stdout; the executor and the probe delimit their sections with markers.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpuk8s.errors import ConnectError, ConnectionLost

#: Exceptions that mean "the network or sshd is not there (yet)": worth a retry.
_RETRYABLE = (socket.timeout, TimeoutError, ConnectionError, OSError, EOFError)


@dataclass(frozen=True)
class CommandResult:
    """What one remote script did: its exit code and its output (stderr merged in)."""

    exit_code: int
    stdout: str
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Redactor:
    """Replaces every registered secret value with ``<redacted>`` in any text."""

    def __init__(self) -> None:
        self._secrets: set[str] = set()
        self._lock = threading.Lock()

    def add(self, *values: str | None) -> None:
        with self._lock:
            for value in values:
                if value and len(value) >= 4:
                    self._secrets.add(value)

    def __call__(self, text: str) -> str:
        for secret in sorted(self._secrets, key=len, reverse=True):
            if secret in text:
                text = text.replace(secret, "<redacted>")
        return text


@dataclass
class Counters:
    """Round trips made through one transport (benchmarks and tests read these)."""

    connects: int = 0
    execs: int = 0
    bytes_out: int = 0
    bytes_in: int = 0


@dataclass(frozen=True)
class ConnectSpec:
    """Everything needed to reach one host; built from the inventory by the api layer."""

    name: str
    address: str
    port: int = 22
    user: str = "root"
    key_files: tuple[str, ...] = ()
    become: bool = False
    become_password: str | None = field(default=None, repr=False)
    local: bool = False
    proxy_jump: str | None = None
    proxy_command: str | None = None
    known_hosts_files: tuple[str, ...] = ()
    ssh_config_file: str | None = None
    #: "yes" (refuse unknown keys), "accept-new" (trust on first use), "no" (lab use only).
    host_key_policy: str = "yes"
    connect_timeout: float = 10.0


class Transport(Protocol):
    name: str
    counters: Counters

    def run(self, script: str, *, timeout: float | None = None) -> CommandResult: ...
    def wait_reboot(self, old_boot_id: str, timeout: float) -> str: ...
    def close(self) -> None: ...


def _wrap(spec: ConnectSpec) -> tuple[str, str]:
    """The remote command line and the stdin prefix that become root for one script."""
    if spec.user == "root" or not spec.become:
        return "sh -s", ""
    if spec.become_password is not None:
        # -k: never reuse a cached timestamp, so the first stdin line is always the password and
        # never reaches sh; -p '': no prompt text in the output.
        return "sudo -k -S -p '' -- sh -s", spec.become_password + "\n"
    return "sudo -n -- sh -s", ""


class _TrustOnFirstUse:
    """paramiko policy for ``StrictHostKeyChecking=accept-new``: remember unknown keys."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        if self.path:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="ascii") as fh:
                fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


class SSHTransport:
    """One persistent SSH connection to a host (Fabric for config and gateways, paramiko exec)."""

    def __init__(self, spec: ConnectSpec, redact: Redactor | None = None,
                 retries: int = 2, backoff: float = 1.0) -> None:
        self.spec = spec
        self.name = spec.name
        self.redact = redact or Redactor()
        self.redact.add(spec.become_password)
        self.counters = Counters()
        self.retries = retries
        self.backoff = backoff
        self._conn: Any = None
        self._lock = threading.Lock()

    # -- connection -------------------------------------------------------------------------
    def _open(self) -> Any:
        import fabric
        import paramiko

        spec = self.spec
        config = fabric.Config(runtime_ssh_path=spec.ssh_config_file) if spec.ssh_config_file \
            else fabric.Config()
        gateway: Any = None
        if spec.proxy_command:
            gateway = spec.proxy_command
        elif spec.proxy_jump:
            gateway = _jump_connection(spec, config)
        connect_kwargs: dict[str, Any] = {"banner_timeout": spec.connect_timeout,
                                          "auth_timeout": spec.connect_timeout}
        if spec.key_files:
            connect_kwargs["key_filename"] = list(spec.key_files)
        conn = fabric.Connection(spec.address, user=spec.user, port=spec.port, config=config,
                                 gateway=gateway, connect_timeout=spec.connect_timeout,
                                 connect_kwargs=connect_kwargs)
        client = conn.client
        client.get_host_keys().clear()
        client.load_system_host_keys()
        user_known = os.path.expanduser("~/.ssh/known_hosts")
        files = [*spec.known_hosts_files] or ([user_known] if os.path.exists(user_known) else [])
        for path in files:
            if os.path.exists(path):
                client.load_host_keys(path) if path == files[0] else \
                    client.get_host_keys().load(path)
        if spec.host_key_policy == "accept-new":
            client.set_missing_host_key_policy(_TrustOnFirstUse(files[0] if files else None))
        elif spec.host_key_policy == "no":
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        else:
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        conn.open()
        self.counters.connects += 1
        return conn

    def connect(self) -> None:
        """Open the connection, retrying network errors (never auth or host-key errors)."""
        import paramiko

        delay = self.backoff
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                self._conn = self._open()
                return
            except paramiko.BadHostKeyException as exc:
                raise ConnectError(self.name, (
                    f"HOST KEY CHANGED for {self.spec.address}: the server presented a "
                    f"{exc.key.get_name()} key that does not match known_hosts. This may be an "
                    "attack or a reinstalled host; if you reinstalled it, remove the old key with "
                    f"`ssh-keygen -R {self.spec.address}` and connect again.")) from None
            except paramiko.AuthenticationException as exc:
                raise ConnectError(self.name, f"authentication failed for "
                                   f"{self.spec.user}@{self.spec.address}: {exc}") from None
            except paramiko.SSHException as exc:
                text = str(exc)
                if "not found in known_hosts" in text:
                    raise ConnectError(self.name, (
                        f"host key of {self.spec.address} is unknown. Verify it and add it to "
                        "known_hosts (ssh-keyscan), or opt in to trust-on-first-use with "
                        "ansible_ssh_common_args: '-o StrictHostKeyChecking=accept-new'."),
                    ) from None
                last = exc
            except _RETRYABLE as exc:
                last = exc
            if attempt < self.retries:
                time.sleep(delay)
                delay *= 2
        raise ConnectError(self.name, f"cannot connect to {self.spec.address}:{self.spec.port}: "
                           f"{last}")

    def _client(self) -> Any:
        if self._conn is None:
            self.connect()
        return self._conn.client

    # -- commands ---------------------------------------------------------------------------
    def run(self, script: str, *, timeout: float | None = None) -> CommandResult:
        command, prefix = _wrap(self.spec)
        payload = (prefix + script).encode()
        started = time.monotonic()
        import paramiko

        with self._lock:
            transport = self._client().get_transport()
            if transport is None or not transport.is_active():
                self._conn = None
                transport = self._client().get_transport()
            try:
                chan = transport.open_session()
            except (EOFError, OSError, paramiko.SSHException) as exc:
                self._conn = None
                raise ConnectionLost(self.name, repr(exc)) from None
            self.counters.execs += 1
            try:
                chan.set_combine_stderr(True)
                if timeout:
                    chan.settimeout(timeout)
                chan.exec_command(command)
                chan.sendall(payload)
                chan.shutdown_write()
                chunks = []
                while True:
                    data = chan.recv(65536)
                    if not data:
                        break
                    chunks.append(data)
                code = chan.recv_exit_status()
            except TimeoutError:
                chan.close()
                return CommandResult(124, f"timed out after {timeout}s",
                                     time.monotonic() - started)
            except (EOFError, OSError, paramiko.SSHException) as exc:
                # sshd or the host went away mid-command (paramiko raises EOFError or
                # "SSH session not active" when the transport dies under an open channel)
                self._conn = None
                raise ConnectionLost(self.name, repr(exc)) from None
            finally:
                chan.close()
        out = b"".join(chunks).decode(errors="replace")
        self.counters.bytes_out += len(payload)
        self.counters.bytes_in += len(out)
        if prefix and code == 1 and out.startswith("Sorry, try again."):
            raise ConnectError(self.name, f"sudo rejected the become password for "
                               f"{self.spec.user}@{self.spec.address}")
        return CommandResult(code, out, time.monotonic() - started)

    def check_sudo(self) -> None:
        """Fail early, with one clear error, when sudo refuses us."""
        result = self.run("id -u")
        if result.stdout.strip().splitlines()[-1:] != ["0"]:
            why = self.redact(result.stdout.strip()) or f"exit {result.exit_code}"
            if self.spec.become_password is None and "password" in why:
                why += (" (set ansible_become_password in host_vars, export "
                        "GPUK8S_BECOME_PASSWORD, or pass --ask-become-pass)")
            raise ConnectError(self.name, f"cannot become root with sudo as "
                               f"{self.spec.user}: {why}")

    def _wait_drop(self, timeout: float) -> None:
        """Wait (up to ``timeout``) for the open connection to close, as it does when the host
        goes down: an event, rather than a guess of how long shutting down takes."""
        transport = self._conn.client.get_transport() if self._conn is not None else None
        if transport is not None and transport.is_active():
            transport.join(timeout)

    def wait_reboot(self, old_boot_id: str, timeout: float) -> str:
        """Wait until the host is back with a new boot id; return it."""
        deadline = time.monotonic() + timeout
        self._wait_drop(min(5.0, timeout))
        self.close()
        while time.monotonic() < deadline:
            try:
                self._conn = self._open()
                boot = self.run("cat /proc/sys/kernel/random/boot_id").stdout.strip()
                if boot and boot != old_boot_id:
                    return boot
                self._wait_drop(min(5.0, max(0.0, deadline - time.monotonic())))
                self.close()
            except Exception:
                self._conn = None
                # down or still booting: sshd refuses or times out; try again shortly
                time.sleep(0.2)
        raise ConnectError(self.name, f"did not come back within {timeout:.0f}s after reboot")

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


def _jump_connection(spec: ConnectSpec, config: Any) -> Any:
    """An opened connection to the ProxyJump host, with the same keys and host-key policy as
    the target (a bastion's key is checked like any other)."""
    target = spec.proxy_jump or ""
    user, _, hostport = target.rpartition("@")
    host, _, port = hostport.partition(":")
    jump = ConnectSpec(name=f"{spec.name} (via {host})", address=host,
                       port=int(port) if port else 22, user=user or spec.user,
                       key_files=spec.key_files, known_hosts_files=spec.known_hosts_files,
                       ssh_config_file=spec.ssh_config_file,
                       host_key_policy=spec.host_key_policy,
                       connect_timeout=spec.connect_timeout)
    return SSHTransport(jump, retries=0)._open()


class LocalTransport:
    """Runs scripts on this machine (``ansible_connection: local``)."""

    def __init__(self, spec: ConnectSpec, redact: Redactor | None = None) -> None:
        self.spec = spec
        self.name = spec.name
        self.redact = redact or Redactor()
        self.redact.add(spec.become_password)
        self.counters = Counters(connects=1)

    def connect(self) -> None:
        return None

    def check_sudo(self) -> None:
        result = self.run("id -u")
        if result.stdout.strip().splitlines()[-1:] != ["0"]:
            raise ConnectError(self.name, "cannot become root on the local machine: "
                               + self.redact(result.stdout.strip()))

    def run(self, script: str, *, timeout: float | None = None) -> CommandResult:
        started = time.monotonic()
        if os.geteuid() == 0:
            argv, prefix = ["sh", "-s"], ""
        else:
            command, prefix = _wrap(ConnectSpec(name=self.name, address="localhost",
                                                user="nobody", become=True,
                                                become_password=self.spec.become_password))
            argv = command.split()
        self.counters.execs += 1
        try:
            proc = subprocess.run(argv, input=(prefix + script).encode(), capture_output=True,
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return CommandResult(124, f"timed out after {timeout}s", time.monotonic() - started)
        out = (proc.stdout + proc.stderr).decode(errors="replace")
        return CommandResult(proc.returncode, out, time.monotonic() - started)

    def wait_reboot(self, old_boot_id: str, timeout: float) -> str:
        raise ConnectError(self.name, "cannot reboot the machine gpuk8s runs on; reboot it by "
                           "hand and run gpuk8s again")

    def close(self) -> None:
        return None


def open_transport(spec: ConnectSpec, redact: Redactor) -> SSHTransport | LocalTransport:
    """A connected transport for one host (raises ConnectError)."""
    transport: SSHTransport | LocalTransport
    transport = LocalTransport(spec, redact) if spec.local else SSHTransport(spec, redact)
    transport.connect()
    if spec.user != "root" and spec.become:
        transport.check_sudo()
    return transport


def open_all(specs: Iterable[ConnectSpec], redact: Redactor,
             opener: Callable[[ConnectSpec, Redactor], Any] = open_transport,
             ) -> tuple[dict[str, Any], dict[str, ConnectError]]:
    """Connect to every host in parallel; return (transports, errors) keyed by host name."""
    transports: dict[str, Any] = {}
    errors: dict[str, ConnectError] = {}
    lock = threading.Lock()

    def one(spec: ConnectSpec) -> None:
        try:
            t = opener(spec, redact)
            with lock:
                transports[spec.name] = t
        except ConnectError as exc:
            with lock:
                errors[spec.name] = exc

    threads = [threading.Thread(target=one, args=(s,), daemon=True) for s in specs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return transports, errors
