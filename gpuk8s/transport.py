"""SSH and local connections: the only module that imports fabric and paramiko.

Every command is a POSIX sh script sent on stdin to ``sh -s`` (through ``sudo`` when the login user
is not root), so nothing a script contains, secrets included, appears in a process list. stderr is
merged into stdout; the executor and the probe delimit their sections with markers.

Trust: every hop (the host and each bastion, from the inventory or from ``~/.ssh/config``) has its
host key checked against the same known_hosts files with the same policy. Output from a node is
untrusted text: at most ``MAX_OUTPUT_BYTES`` of it is read per command. The sudo password is sent
only to a host whose sudo asks for one (``sudo -n true`` fails there).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpuk8s.errors import ConnectError, ConnectionLost
from gpuk8s.sinks import shell

#: Exceptions that mean "the network or sshd is not there (yet)": worth a retry.
_RETRYABLE = (socket.timeout, TimeoutError, ConnectionError, OSError, EOFError)

#: The most output (stdout and stderr together) read from one command. Past it the command
#: fails for its host: a broken or hostile node must not exhaust this machine's memory.
MAX_OUTPUT_BYTES = 64 * 1024 * 1024

#: Bastions in a row (ProxyJump lists, a bastion's own ProxyJump); more means a config loop.
MAX_HOPS = 8

#: Where keys are checked and (accept-new) recorded when no UserKnownHostsFile is named.
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"

#: Serialises appends to known_hosts files (hosts connect in parallel threads).
_RECORD_LOCK = threading.Lock()


@dataclass(frozen=True)
class CommandResult:
    """What one remote script did: its exit code and its output (stderr merged in)."""

    exit_code: int
    stdout: str
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^\s/:@'\"]+:)[^\s/@'\"]+@")


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
        # a password in a URL (http://user:pass@proxy), wherever it came from
        return _URL_PASSWORD.sub(r"\1<redacted>@", text)


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
    #: "yes" (refuse unknown keys), "accept-new" (trust on first use, always recorded in the
    #: first known_hosts file), "no" (accept unknown keys, in memory only: lab use only);
    #: a changed or @revoked key is refused under every policy.
    host_key_policy: str = "yes"
    connect_timeout: float = 10.0


class Transport(Protocol):
    name: str
    counters: Counters

    def run(self, script: str, *, timeout: float | None = None) -> CommandResult: ...
    def wait_reboot(self, old_boot_id: str, timeout: float) -> str: ...
    def close(self) -> None: ...


class OutputTooLarge(ConnectError):
    """A command printed more than ``MAX_OUTPUT_BYTES``: its host fails, the output is dropped."""


def _size(n: int) -> str:
    mib = 1024 * 1024
    return f"{n // mib} MiB" if n % mib == 0 else f"{n} bytes"


def _check_password(spec: ConnectSpec) -> None:
    """Refuse a become password that sudo would cut at a line break (the rest would reach
    root's ``sh`` as a command line)."""
    if spec.become_password is not None and ("\n" in spec.become_password
                                             or "\r" in spec.become_password):
        raise ConnectError(spec.name, (
            "the become password (ansible_become_password, GPUK8S_BECOME_PASSWORD or the "
            "prompt) contains a line break; sudo reads a password only up to the first line "
            "break. Set the password without newlines."))


def _wrap(spec: ConnectSpec, nopasswd: bool = False) -> tuple[str, str]:
    """The remote command line and the stdin prefix that become root for one script.

    ``nopasswd``: this host's sudo needs no password (``sudo -n true`` succeeded), so the
    password is never sent: sudo would not read it and root's sh would run it as a command.
    """
    if spec.user == "root" or not spec.become:
        return "sh -s", ""
    if spec.become_password is not None and not nopasswd:
        _check_password(spec)
        # -k: never reuse a cached timestamp, so the first stdin line is always the password and
        # never reaches sh; -p '': no prompt text in the output.
        return "sudo -k -S -p '' -- sh -s", spec.become_password + "\n"
    return "sudo -n -- sh -s", ""


#: Asks whether sudo would run a command without a password (-k: a cached timestamp does not
#: count, so the answer holds for the whole run).
_SUDO_PROBE = "sudo -k -n -- true"


# -- host keys ------------------------------------------------------------------------------
class _Refused(Exception):
    """Connecting failed in a way a retry cannot fix (a host key, authentication, a config
    loop); the message names the hop and says what to do."""


class _HopDown(Exception):
    """A bastion could not be reached (worth a retry); the message names the bastion."""


def _known_name(host: str, port: int) -> str:
    """How known_hosts names a host (and how paramiko asks for it)."""
    return host if port == 22 else f"[{host}]:{port}"


def _pattern_matches(patterns: str, name: str) -> bool:
    """OpenSSH host-pattern matching of a known_hosts name field: comma-separated patterns with
    ``*`` and ``?``, ``!`` negation, or a hashed ``|1|salt|hash`` name."""
    import paramiko

    name = name.lower()
    if patterns.startswith("|1|"):
        try:
            return paramiko.HostKeys.hash_host(name, patterns) == patterns
        except Exception:  # a malformed hash matches nothing
            return False
    matched = False
    for pattern in patterns.lower().split(","):
        negated = pattern.startswith("!")
        pattern = pattern[1:] if negated else pattern
        regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
        if re.fullmatch(regex, name):
            if negated:
                return False
            matched = True
    return matched


def _is_pattern(names: str) -> bool:
    return any(c in names for c in "*?!")


@dataclass(frozen=True)
class _Line:
    patterns: str
    keytype: str
    blob: str
    where: str  # file:line
    key: Any = None  # parsed paramiko PKey (plain lines only)


class KnownHosts:
    """The known_hosts files of one connection, read the way OpenSSH reads them: only the
    files named with UserKnownHostsFile/GlobalKnownHostsFile (else ``~/.ssh/known_hosts``);
    ``@revoked`` keys are refused; ``@cert-authority`` lines are noted (gpuk8s cannot check
    host certificates) and never trusted; lines that cannot be parsed are skipped."""

    def __init__(self, files: Iterable[str] = ()) -> None:
        self.files = [os.path.expanduser(f) for f in files] or \
            [os.path.expanduser(DEFAULT_KNOWN_HOSTS)]
        self.plain: list[_Line] = []
        self.revoked: list[_Line] = []
        self.authorities: list[_Line] = []
        for path in self.files:
            self._read(path)

    @property
    def record_file(self) -> str:
        """Where accept-new records a new key: the first file, as ssh does."""
        return self.files[0]

    def _read(self, path: str) -> None:
        from paramiko.hostkeys import HostKeyEntry

        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return
        except OSError as exc:
            raise _Refused(f"cannot read the known_hosts file {path}: "
                           f"{exc.strerror or exc}; fix its permissions or name another file "
                           "with -o UserKnownHostsFile=...") from None
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.split()
            marker = fields.pop(0) if fields[0].startswith("@") else ""
            if len(fields) < 3:
                continue  # not a key line: ssh skips it too
            entry = _Line(fields[0], fields[1], fields[2], f"{path}:{number}")
            if marker == "@revoked":
                self.revoked.append(entry)
            elif marker == "@cert-authority":
                self.authorities.append(entry)
            elif marker:
                continue  # an unknown marker: ssh ignores the line
            else:
                try:
                    parsed = HostKeyEntry.from_line(" ".join(fields[:3]))
                except Exception:  # bad base64 or key data: ssh skips such lines
                    parsed = None
                if parsed is not None and parsed.key is not None:
                    self.plain.append(_Line(fields[0], fields[1], fields[2],
                                            entry.where, parsed.key))

    def revocation(self, name: str, key: Any) -> str | None:
        """Where ``key`` is listed @revoked for ``name`` (None: it is not)."""
        blob = key.get_base64()
        for line in self.revoked:
            if line.blob == blob and _pattern_matches(line.patterns, name):
                return line.where
        return None

    def install(self, client: Any, name: str) -> None:
        """Put the exact-name (and hashed) keys in a paramiko client that connects to ``name``:
        paramiko then prefers their key types and refuses a different key itself. Keys listed
        @revoked for ``name`` are left out, so they reach the policy and are refused there."""
        keys = client.get_host_keys()
        keys.clear()
        for line in self.plain:
            if _is_pattern(line.patterns) and not line.patterns.startswith("|1|"):
                continue  # wildcards: matched by the policy
            if self.revocation(name, line.key) is None:
                for each in line.patterns.split(","):
                    keys.add(each, line.keytype, line.key)

    def by_pattern(self, name: str) -> list[_Line]:
        """Plain lines whose wildcard patterns match ``name`` (paramiko matches exact names)."""
        return [line for line in self.plain if _is_pattern(line.patterns)
                and not line.patterns.startswith("|1|") and _pattern_matches(line.patterns, name)]

    def authority_for(self, name: str) -> _Line | None:
        return next((a for a in self.authorities if _pattern_matches(a.patterns, name)), None)

    def record(self, name: str, key: Any) -> None:
        """Append ``name``'s key to the first file; create ``~/.ssh`` (0700) and the file
        (0600) when missing. Raises _Refused when it cannot be recorded."""
        path = Path(self.record_file)
        line = f"{name} {key.get_name()} {key.get_base64()}\n"
        with _RECORD_LOCK:
            try:
                if not path.parent.is_dir():
                    path.parent.mkdir(mode=0o700, parents=True)
                    path.parent.chmod(0o700)
                if path.exists() and not path.is_file():
                    raise _Refused(
                        f"cannot record the host key of {name}: {path} is not a regular file. "
                        "StrictHostKeyChecking=accept-new must record the keys it accepts; name "
                        "a real file with -o UserKnownHostsFile=..., or use "
                        "StrictHostKeyChecking=no for a throwaway lab")
                created = not path.exists()
                fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
                with os.fdopen(fd, "r+b") as fh:
                    if created:
                        os.chmod(path, 0o600)
                    size = fh.seek(0, os.SEEK_END)
                    if size:
                        fh.seek(size - 1)
                        if fh.read(1) != b"\n":
                            line = "\n" + line
                    fh.write(line.encode())
            except OSError as exc:
                raise _Refused(f"cannot record the host key of {name} in {path}: "
                               f"{exc.strerror or exc}; StrictHostKeyChecking=accept-new must "
                               "record the keys it accepts: fix the file's permissions or name "
                               "another with -o UserKnownHostsFile=...") from None


class _HostKeyPolicy:
    """The one host-key policy of every hop (the host and each bastion). paramiko calls
    ``missing_host_key`` for a name without an exact-name key, and refuses a different key
    itself (BadHostKeyException, turned into ``changed``). Revoked, wildcard-matched,
    certificate-only and unknown keys are decided here; ``policy`` is "yes", "accept-new" (record
    the key, then accept it) or "no" (accept it, in memory only)."""

    def __init__(self, known: KnownHosts, policy: str, label: str, host: str, port: int) -> None:
        self.known = known
        self.policy = policy
        self.label = label  # how errors name this hop: "10.0.0.5", "bastion jump.lab (...)"
        self.host = host
        self.port = port

    def _revoked(self, name: str, key: Any) -> None:
        where = self.known.revocation(name, key)
        if where:
            raise _Refused(
                f"host key of {self.label} is REVOKED: the server presented the "
                f"{key.get_name()} key listed as @revoked at {where}. It must never be accepted; "
                "find out why the host still uses it, and give it a new key.")

    def _keyscan(self) -> str:
        port = f" -p {self.port}" if self.port != 22 else ""
        return f"`ssh-keyscan{port} {self.host}`"

    def changed(self, name: str, key: Any) -> _Refused:
        self._revoked(name, key)
        return _Refused(
            f"HOST KEY CHANGED for {self.label}: the server presented a {key.get_name()} key "
            f"that does not match {', '.join(self.known.files)}. This may be an attack or a "
            "reinstalled host; if you reinstalled it, remove the old key with "
            f"`ssh-keygen -R {shell(_known_name(self.host, self.port))} -f "
            f"{shell(self.known.record_file)}` "
            "and connect again.")

    def missing_host_key(self, client: Any, name: str, key: Any) -> None:
        self._revoked(name, key)
        matches = self.known.by_pattern(name)
        if matches:
            if any(m.blob == key.get_base64() for m in matches):
                return
            raise self.changed(name, key)
        if self.policy == "no":  # opted out: remember it for this connection only
            client.get_host_keys().add(name, key.get_name(), key)
            return
        authority = self.known.authority_for(name)
        if authority is not None:
            raise _Refused(
                f"host key of {self.label} is not known: {authority.where} has a "
                "@cert-authority line for it, but gpuk8s cannot check SSH host certificates. "
                f"Add the host's own key to {self.known.record_file} "
                f"({self._keyscan()}, after checking it).")
        if self.policy == "accept-new":
            self.known.record(name, key)
            client.get_host_keys().add(name, key.get_name(), key)
            return
        raise _Refused(
            f"host key of {self.label} is unknown. Verify it and add it to "
            f"{self.known.record_file} ({self._keyscan()} shows it), or opt in to "
            "trust-on-first-use with "
            "ansible_ssh_common_args: '-o StrictHostKeyChecking=accept-new'.")


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
                 retries: int = 2, backoff: float = 1.0) -> None:
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
            conn.open()
        except paramiko.BadHostKeyException as exc:
            _close_quietly(conn)
            raise policy.changed(name, exc.key) from None
        except paramiko.AuthenticationException as exc:
            _close_quietly(conn)
            raise _Refused(f"authentication failed for {conn.user}@{label}: {exc}") from None
        except (paramiko.SSHException, *_RETRYABLE) as exc:
            _close_quietly(conn)
            if is_hop:
                raise _HopDown(f"cannot connect to {label} ({conn.host}:{conn.port}): "
                               f"{exc}") from None
            raise
        except BaseException:
            _close_quietly(conn)
            raise
        return conn

    def connect(self) -> None:
        """Open the connection, retrying network errors (never auth or host-key errors)."""
        import paramiko

        _check_password(self.spec)
        delay = self.backoff
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                self._conn = self._open()
                return
            except _Refused as exc:
                raise ConnectError(self.name, str(exc)) from None
            except (_HopDown, paramiko.SSHException, *_RETRYABLE) as exc:
                last = exc
            except Exception as exc:  # a library bug or an odd config: this host fails alone
                raise ConnectError(self.name, f"cannot connect to {self.spec.address}:"
                                   f"{self.spec.port}: {type(exc).__name__}: {exc}") from None
            if attempt < self.retries:
                time.sleep(delay)
                delay *= 2
        if isinstance(last, _HopDown):
            raise ConnectError(self.name, str(last))
        raise ConnectError(self.name, f"cannot connect to {self.spec.address}:{self.spec.port}: "
                           f"{last}")

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
            raise ConnectionLost(self.name, repr(exc)) from None
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
            code = chan.recv_exit_status()
        except TimeoutError:
            return None
        except (EOFError, OSError, paramiko.SSHException) as exc:
            # sshd or the host went away mid-command (paramiko raises EOFError or
            # "SSH session not active" when the transport dies under an open channel)
            self._drop()
            raise ConnectionLost(self.name, repr(exc)) from None
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
        ``sudo -n true``: where sudo needs no password, the password is never sent."""
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
            except _Refused as exc:  # a changed host key is not "still booting"
                raise ConnectError(self.name, str(exc)) from None
            except Exception:
                self._drop()
                # down or still booting: sshd refuses or times out; try again shortly
                time.sleep(0.2)
        raise ConnectError(self.name, f"did not come back within {timeout:.0f}s after reboot")

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


def _close_quietly(conn: Any) -> None:
    with contextlib.suppress(Exception):  # closing a half-open one must not hide the cause
        conn.close()


class LocalTransport:
    """Runs scripts on this machine (``ansible_connection: local``)."""

    def __init__(self, spec: ConnectSpec, redact: Redactor | None = None) -> None:
        self.spec = spec
        self.name = spec.name
        self.redact = redact or Redactor()
        self.redact.add(spec.become_password)
        self.counters = Counters(connects=1)
        self._nopasswd: bool | None = None

    def connect(self) -> None:
        _check_password(self.spec)

    def check_sudo(self) -> None:
        result = self.run("id -u")
        if result.stdout.strip().splitlines()[-1:] != ["0"]:
            raise ConnectError(self.name, "cannot become root on the local machine: "
                               + self.redact(result.stdout.strip()))

    def _argv(self) -> tuple[list[str], str]:
        """The command (an argv list: nothing is split) and the stdin prefix."""
        if os.geteuid() == 0:
            return ["sh", "-s"], ""
        password = self.spec.become_password
        if password is None:
            return ["sudo", "-n", "--", "sh", "-s"], ""
        if self._nopasswd is None:  # ask once whether sudo would read the password at all
            try:
                probe = subprocess.run(_SUDO_PROBE.split(), stdin=subprocess.DEVNULL,
                                       capture_output=True, timeout=30, check=False)
                self._nopasswd = probe.returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                self._nopasswd = False
        if self._nopasswd:
            return ["sudo", "-n", "--", "sh", "-s"], ""
        _check_password(self.spec)
        return ["sudo", "-k", "-S", "-p", "", "--", "sh", "-s"], password + "\n"

    def run(self, script: str, *, timeout: float | None = None) -> CommandResult:
        started = time.monotonic()
        argv, prefix = self._argv()
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
        except Exception as exc:  # whatever went wrong, this host is reported, never lost
            with lock:
                errors[spec.name] = ConnectError(spec.name, redact(
                    f"cannot connect to {spec.address}:{spec.port}: unexpected "
                    f"{type(exc).__name__}: {exc}"))

    specs = list(specs)
    threads = [threading.Thread(target=one, args=(s,), daemon=True) for s in specs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for spec in specs:
        if spec.name not in transports and spec.name not in errors:
            errors[spec.name] = ConnectError(spec.name, "the connection attempt ended without "
                                             "a result (see the messages above)")
    return transports, errors
