"""SSH connections (Fabric/Paramiko): the host and every bastion checked with one host-key
policy, scripts on stdin to ``sh -s``, reconnect after a reboot."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gpuk8s.errors import ConnectError, ConnectionLost
from gpuk8s.transport.base import (
    _RETRYABLE,
    _SUDO_PROBE,
    MAX_HOPS,
    MAX_OUTPUT_BYTES,
    CommandResult,
    ConnectSpec,
    Counters,
    OutputTooLarge,
    Redactor,
    _check_password,
    _size,
    _wrap,
)
from gpuk8s.transport.known_hosts import KnownHosts, _HostKeyPolicy, _known_name, _Refused
from gpuk8s.transport.ssh_errors import (
    BOOT_POLL_S,
    _ClosedInAuth,
    _open_telling_drops,
    _still_refused,
    describe,
)

# paramiko logs an SSH handshake that fails (a host rebooting: "Error reading SSH protocol
# banner") with a traceback; without a handler Python would print it on the terminal. gpuk8s
# reports connection failures itself, and a run's folder keeps paramiko's log (RunLog).
logging.getLogger("paramiko").addHandler(logging.NullHandler())


class _HopDown(Exception):
    """A bastion could not be reached (worth a retry); the message names the bastion."""


def _split_jump(text: str) -> tuple[str | None, str, int | None]:
    """``[ssh://][user@]host[:port]`` (host may be ``[v6]``) -> (user, host, port)."""
    text = text.strip()
    if text.startswith("ssh://"):
        text = text[len("ssh://"):].rstrip("/")
    user, at, hostport = text.rpartition("@")
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif hostport.count(":") == 1:
        host, _, port = hostport.partition(":")
    else:
        host, port = hostport, ""
    if not host or (port and not port.isdigit()):
        raise _Refused(f"cannot read the ProxyJump hop {text!r}: write [user@]host[:port]")
    return (user if at else None), host, (int(port) if port else None)


class SSHTransport:
    """One persistent SSH connection to a host (Fabric for config and gateways, paramiko exec)."""

    def __init__(self, spec: ConnectSpec, redact: Redactor | None = None,
                 retries: int = 2, backoff: float = 1.0,
                 notify: Callable[[str], None] | None = None) -> None:
        self.spec = spec
        self.name = spec.name
        self.redact = redact or Redactor()
        self.redact.add(spec.become_password)
        self.counters = Counters()
        self.retries = retries
        self.backoff = backoff
        self._conn: Any = None
        self._hops: list[Any] = []  # opened bastion connections, first hop first
        self._nopasswd: bool | None = None  # sudo needs no password here (probed once)
        self._lock = threading.Lock()
        #: called with each chunk of a command's output as it arrives (live progress)
        self.on_output: Callable[[bytes], None] | None = None
        #: says what a wait is for on the terminal (a host still booting); node text in it is
        #: already passed through gpuk8s.report.untrusted
        self.notify: Callable[[str], None] = notify or _to_stderr

    # -- connection -------------------------------------------------------------------------
    def _open(self) -> Any:
        """Open the connection and every bastion on the way, each checked with the same
        known_hosts files and policy. Raises _Refused, _HopDown or a network error."""
        import fabric

        spec = self.spec
        config = fabric.Config(runtime_ssh_path=spec.ssh_config_file) if spec.ssh_config_file \
            else fabric.Config()
        known = KnownHosts(spec.known_hosts_files)
        hops: list[Any] = []
        try:
            conn = self._dial(config, known, hops, address=spec.address, port=spec.port,
                              user=spec.user, label=spec.address,
                              proxy_jump=spec.proxy_jump, proxy_command=spec.proxy_command,
                              origin="the inventory", depth=0)
        except BaseException:
            for hop in reversed(hops):
                _close_quietly(hop)
            raise
        self._hops = hops
        self.counters.connects += 1
        return conn

    def _dial(self, config: Any, known: KnownHosts, hops: list[Any], *, address: str,
              port: int | None, user: str, label: str, proxy_jump: str | None,
              proxy_command: str | None, origin: str, depth: int) -> Any:
        """Open one connection to ``address``, through its bastions (opened here first, never
        by Fabric, whose own ProxyJump hops accept any key). ``label`` names this hop in
        errors; bastions are appended to ``hops``."""
        spec = self.spec
        if depth > MAX_HOPS:
            raise _Refused(f"more than {MAX_HOPS} bastions in a row to reach {label}: is there "
                           "a ProxyJump loop in ~/.ssh/config? Add `ProxyJump none` to the "
                           "bastion's Host block")
        ssh_config = config.base_ssh_config.lookup(address)
        if not proxy_jump and not proxy_command:  # nothing from the inventory: ~/.ssh/config
            jump = ssh_config.get("proxyjump")
            if jump and jump.lower() != "none":
                proxy_jump, origin = jump, "~/.ssh/config"
            else:
                proxy_command = ssh_config.get("proxycommand") or None
        gateway: Any = False  # False: Fabric must not resolve a gateway itself
        if proxy_jump:
            for text in proxy_jump.split(","):
                hop_user, hop_host, hop_port = _split_jump(text)
                if hop_host in (address, ssh_config.get("hostname")) and hop_port in (None, port):
                    continue  # a wildcard Host block that names the bastion itself: go direct
                hop_user = hop_user or config.base_ssh_config.lookup(hop_host).get("user") \
                    or spec.user
                where = f"bastion {hop_host} (ProxyJump {text.strip()} from {origin}, for {label})"
                if gateway is False:  # the first bastion: reached as ~/.ssh/config says
                    hop = self._dial(config, known, hops, address=hop_host, port=hop_port,
                                     user=hop_user, label=where, proxy_jump=None,
                                     proxy_command=None, origin="~/.ssh/config",
                                     depth=depth + 1)
                else:  # the next ones: through the previous bastion
                    hop = self._connection(config, known, address=hop_host, port=hop_port,
                                           user=hop_user, label=where, gateway=gateway,
                                           is_hop=True)
                hops.append(hop)
                gateway = hop
        elif proxy_command:
            gateway = proxy_command
        return self._connection(config, known, address=address, port=port, user=user,
                                label=label, gateway=gateway, is_hop=depth > 0)

    def _connection(self, config: Any, known: KnownHosts, *, address: str, port: int | None,
                    user: str, label: str, gateway: Any, is_hop: bool) -> Any:
        """One opened Fabric connection whose host key is checked by _HostKeyPolicy."""
        import fabric
        import paramiko

        spec = self.spec
        connect_kwargs: dict[str, Any] = {"banner_timeout": spec.connect_timeout,
                                          "auth_timeout": spec.connect_timeout}
        if spec.key_files:
            connect_kwargs["key_filename"] = list(spec.key_files)
        conn = fabric.Connection(address, user=user, port=port, config=config, gateway=gateway,
                                 connect_timeout=spec.connect_timeout,
                                 connect_kwargs=connect_kwargs)
        policy = _HostKeyPolicy(known, spec.host_key_policy, label, conn.host, conn.port)
        name = _known_name(conn.host, conn.port)
        known.install(conn.client, name)
        conn.client.set_missing_host_key_policy(policy)
        try:
            _open_telling_drops(conn)
        except paramiko.BadHostKeyException as exc:
            _close_quietly(conn)
            raise policy.changed(name, exc.key) from None
        except paramiko.AuthenticationException as exc:
            _close_quietly(conn)
            raise _Refused(f"authentication failed for {conn.user}@{label}: {exc}") from None
        except (_ClosedInAuth, paramiko.SSHException, *_RETRYABLE) as exc:
            _close_quietly(conn)
            if is_hop:
                raise _HopDown(f"cannot connect to {label} ({conn.host}:{conn.port}): "
                               f"{describe(exc, spec.connect_timeout)}") from None
            raise
        except BaseException:
            _close_quietly(conn)
            raise
        return conn

    def connect(self) -> None:
        """Open the connection, retrying network errors (never auth or host-key errors). A
        server that takes the key, then closes the connection with a message (pam_nologin
        while the host boots refuses every user but root) is tried again until the connect
        timeout has passed since its first refusal, saying so on the terminal."""
        import paramiko

        _check_password(self.spec)
        spec = self.spec
        delay = self.backoff
        last: Exception | None = None
        attempt = 0
        refused_since: float | None = None
        while True:
            try:
                self._conn = self._open()
                return
            except _Refused as exc:
                raise ConnectError(self.name, str(exc)) from None
            except _ClosedInAuth as exc:
                if exc.said:
                    now = time.monotonic()
                    if refused_since is None:
                        refused_since = now
                        self.notify(f"{self.name}: {spec.user}@{spec.address} was refused "
                                    f"after its key was accepted; sshd said: {exc.said!r}. "
                                    f"Waiting up to {spec.connect_timeout:g}s (the connect "
                                    "timeout) for the host to finish booting")
                    if now - refused_since + BOOT_POLL_S > spec.connect_timeout:
                        raise ConnectError(self.name, _still_refused(
                            spec, exc.said, now - refused_since)) from None
                    time.sleep(BOOT_POLL_S)
                    continue
                last = exc
            except (_HopDown, paramiko.SSHException, *_RETRYABLE) as exc:
                last = exc
            except Exception as exc:  # a library bug or an odd config: this host fails alone
                raise ConnectError(self.name, f"cannot connect to {spec.address}:"
                                   f"{spec.port}: {type(exc).__name__}: {exc}") from None
            if attempt >= self.retries:
                break
            attempt += 1
            time.sleep(delay)
            delay *= 2
        if isinstance(last, _HopDown):
            raise ConnectError(self.name, str(last))
        assert last is not None
        raise ConnectError(self.name, f"cannot connect to {spec.address}:{spec.port}: "
                           f"{describe(last, spec.connect_timeout)}")

    def _client(self) -> Any:
        if self._conn is None:
            self.connect()
        return self._conn.client

    def _drop(self) -> None:
        """Forget a dead connection (and its bastions)."""
        for conn in [self._conn, *reversed(self._hops)]:
            if conn is not None:
                _close_quietly(conn)
        self._conn, self._hops = None, []

    # -- commands ---------------------------------------------------------------------------
    def _exec(self, command: str, payload: bytes, timeout: float | None,
              what: str) -> tuple[int, bytes] | None:
        """Run one command line with ``payload`` on stdin; (exit code, output), or None when
        it timed out. Holds the lock. Reads at most MAX_OUTPUT_BYTES (OutputTooLarge)."""
        import paramiko

        transport = self._client().get_transport()
        if transport is None or not transport.is_active():
            self._drop()
            transport = self._client().get_transport()
        try:
            chan = transport.open_session()
        except (EOFError, OSError, paramiko.SSHException) as exc:
            self._drop()
            raise ConnectionLost(self.name, f"{describe(exc)} ({type(exc).__name__})") from None
        self.counters.execs += 1
        limit = MAX_OUTPUT_BYTES
        try:
            chan.set_combine_stderr(True)
            if timeout:
                chan.settimeout(timeout)
            chan.exec_command(command)
            chan.sendall(payload)
            chan.shutdown_write()
            chunks = []
            total = 0
            while True:
                data = chan.recv(65536)
                if not data:
                    break
                total += len(data)
                if total > limit:
                    raise OutputTooLarge(self.name, (
                        f"output of {what} exceeded {_size(limit)}; gpuk8s stopped reading it "
                        "and failed this host (a node printing this much is broken or hostile; "
                        "the limit is gpuk8s.transport.MAX_OUTPUT_BYTES)"))
                chunks.append(data)
                if self.on_output is not None:
                    try:  # the display must never look like a lost connection
                        self.on_output(data)
                    except Exception:
                        self.on_output = None
            code = chan.recv_exit_status()
        except TimeoutError:
            return None
        except (EOFError, OSError, paramiko.SSHException) as exc:
            # sshd or the host went away mid-command (paramiko raises EOFError or
            # "SSH session not active" when the transport dies under an open channel)
            self._drop()
            raise ConnectionLost(self.name, f"{describe(exc)} ({type(exc).__name__})") from None
        finally:
            chan.close()
        self.counters.bytes_out += len(payload)
        return code, b"".join(chunks)

    def _sudo_nopasswd(self) -> bool:
        """Whether this host's sudo runs commands without a password (asked once, before the
        password is ever sent). Holds the lock."""
        spec = self.spec
        if spec.user == "root" or not spec.become or spec.become_password is None:
            return False
        if self._nopasswd is None:
            answer = self._exec(_SUDO_PROBE, b"", timeout=max(spec.connect_timeout, 30.0),
                                what="the sudo check")
            self._nopasswd = answer is not None and answer[0] == 0
        return self._nopasswd

    def run(self, script: str, *, timeout: float | None = None) -> CommandResult:
        started = time.monotonic()
        with self._lock:
            command, prefix = _wrap(self.spec, nopasswd=self._sudo_nopasswd())
            payload = (prefix + script).encode()
            answer = self._exec(command, payload, timeout, what="a command")
        if answer is None:
            return CommandResult(124, f"timed out after {timeout}s", time.monotonic() - started)
        code, raw = answer
        out = raw.decode(errors="replace")
        self.counters.bytes_in += len(out)
        if prefix and code == 1 and out.startswith("Sorry, try again."):
            raise ConnectError(self.name, f"sudo rejected the become password for "
                               f"{self.spec.user}@{self.spec.address}")
        return CommandResult(code, out, time.monotonic() - started)

    def check_sudo(self) -> None:
        """Fail early, with one clear error, when sudo refuses us. The first command asks
        ``sudo -k -n -- sh -c true``: where sudo needs no password, the password is never
        sent."""
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
        last = ""
        while time.monotonic() < deadline:
            try:
                self._conn = self._open()
                boot = self.run("cat /proc/sys/kernel/random/boot_id").stdout.strip()
                if boot and boot != old_boot_id:
                    return boot
                self._wait_drop(min(5.0, max(0.0, deadline - time.monotonic())))
                self.close()
            except _Refused as exc:  # a changed host key is not "still booting"
                raise ConnectError(self.name, str(exc)) from None
            except Exception as exc:
                self._drop()
                # down or still booting (sshd refuses, times out, or pam_nologin closes the
                # login with its banner): try again shortly
                last = describe(exc, self.spec.connect_timeout)
                time.sleep(0.2)
        raise ConnectError(self.name, f"did not come back within {timeout:.0f}s after reboot"
                           + (f" (last attempt: {last})" if last else ""))

    def close(self) -> None:
        if self._conn is not None or self._hops:
            try:
                if self._conn is not None:
                    self._conn.close()
            finally:
                self._conn = None
                for hop in reversed(self._hops):
                    _close_quietly(hop)
                self._hops = []


def _to_stderr(text: str) -> None:
    """Where a transport made without ``notify`` says what it waits for (a session passes its
    Reporter, which escapes node text; the banner in the text is a repr() here, escaped too)."""
    print(text, file=sys.stderr, flush=True)


def _close_quietly(conn: Any) -> None:
    with contextlib.suppress(Exception):  # closing a half-open one must not hide the cause
        conn.close()
