"""Transport security (review findings 5, 9, 10, 11 and the output cap of 14), against real SSH
servers: paramiko's server side, in this process, on 127.0.0.1, with HOME in a temp folder."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import paramiko
import pytest

from gpuk8s import transport as tr
from gpuk8s.errors import ConnectError
from gpuk8s.inventory import load_inventory, validate_all
from gpuk8s.redact import Redactor
from gpuk8s.transport import (
    ConnectSpec,
    LocalTransport,
    OutputTooLarge,
    SSHTransport,
    base,
    open_all,
)
from gpuk8s.transport.ssh_errors import describe as ssh_describe

PASSWORD = "s3cret;id -un"  # what root's sh would run if it ever got it

#: exec handler: (command, stdin) -> (exit code, output, or chunks of output)
Handler = Callable[[str, bytes], tuple[int, "bytes | list[bytes]"]]


def _default_handler(command: str, stdin: bytes) -> tuple[int, bytes | list[bytes]]:
    return 0, b"0\n"


@dataclass
class Exec:
    command: str
    stdin: bytes


@dataclass
class SSHD:
    """A minimal sshd: any public key logs in; exec runs ``handler``; direct-tcpip (ProxyJump)
    is forwarded. Records users, commands and tunnel destinations."""

    key: paramiko.PKey
    handler: Handler = _default_handler
    users: list[str] = field(default_factory=list)
    execs: list[Exec] = field(default_factory=list)
    tunnels: list[tuple[str, int]] = field(default_factory=list)
    #: this many connections are dropped during authentication (sshd going down), then
    #: ``reject`` refuses every key
    drop_auth: int = 0
    reject: bool = False
    #: while set, sshd's PAM account check refuses every user but root after the key is
    #: accepted, as pam_nologin does while /run/nologin exists: the text goes to the client
    #: as an authentication banner, then the connection closes (OpenSSH's userauth_finish)
    nologin: str | None = None
    #: sshd's own Banner, sent before authentication
    banner: str | None = None

    def __post_init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port: int = self.sock.getsockname()[1]
        self._transports: list[paramiko.Transport] = []
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def name(self) -> str:
        return f"[127.0.0.1]:{self.port}"

    def line(self, key: paramiko.PKey | None = None, name: str | None = None) -> str:
        k = key or self.key
        return f"{name or self.name} {k.get_name()} {k.get_base64()}\n"

    def close(self) -> None:
        self.sock.close()
        for t in self._transports:
            t.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        t = paramiko.Transport(conn)
        self._transports.append(t)
        t.add_server_key(self.key)
        pending: dict[int, tuple[str, int]] = {}
        try:
            t.start_server(server=_Server(self, pending, conn, t))
        except Exception:  # the client refused our key: fine
            return
        while t.is_active():
            chan = t.accept(0.5)
            if chan is not None and chan.get_id() in pending:
                dest = pending.pop(chan.get_id())
                out = socket.create_connection(dest)
                threading.Thread(target=_pump, args=(chan, out), daemon=True).start()
                threading.Thread(target=_pump, args=(out, chan), daemon=True).start()

    def _exec(self, chan: paramiko.Channel, command: str) -> None:
        stdin = b""
        try:
            while True:
                data = chan.recv(65536)
                if not data:
                    break
                stdin += data
            self.execs.append(Exec(command, stdin))
            code, out = self.handler(command, stdin)
            for chunk in out if isinstance(out, list) else [out]:
                chan.sendall(chunk)
            chan.send_exit_status(code)
        except Exception:  # the client went away (e.g. past the output cap)
            pass
        finally:
            chan.close()


class _Server(paramiko.ServerInterface):
    def __init__(self, sshd: SSHD, pending: dict[int, tuple[str, int]],
                 conn: socket.socket, transport: paramiko.Transport) -> None:
        self.sshd = sshd
        self.pending = pending
        self.conn = conn
        self.transport = transport

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def get_banner(self) -> tuple[str | None, str | None]:
        return self.sshd.banner, "en-US"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        self.sshd.users.append(username)
        nologin = self.sshd.nologin
        if nologin is not None and username != "root":
            m = paramiko.Message()
            m.add_byte(paramiko.common.cMSG_USERAUTH_BANNER)
            m.add_string(nologin)
            m.add_string("")
            self.transport._send_message(m)
            self.conn.shutdown(socket.SHUT_RDWR)
            return paramiko.AUTH_FAILED
        if self.sshd.drop_auth > 0:
            self.sshd.drop_auth -= 1
            self.conn.shutdown(socket.SHUT_RDWR)
            return paramiko.AUTH_FAILED
        return paramiko.AUTH_FAILED if self.sshd.reject else paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        threading.Thread(target=self.sshd._exec, args=(channel, command.decode()),
                         daemon=True).start()
        return True

    def check_channel_direct_tcpip_request(self, chanid: int, origin: tuple[str, int],
                                           destination: tuple[str, int]) -> int:
        self.sshd.tunnels.append(destination)
        self.pending[chanid] = destination
        return paramiko.OPEN_SUCCEEDED


def _pump(a: Any, b: Any) -> None:
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except Exception:
        pass
    finally:
        for s in (a, b):
            with contextlib.suppress(Exception):
                s.close()


def new_key() -> paramiko.PKey:
    return paramiko.ECDSAKey.generate()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh HOME without ~/.ssh, and a client key outside it."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    new_key().write_private_key_file(str(tmp_path / "id_ecdsa"))
    return home


@pytest.fixture
def servers() -> Iterator[Callable[..., SSHD]]:
    made: list[SSHD] = []

    def make(handler: Handler = _default_handler) -> SSHD:
        made.append(SSHD(new_key(), handler))
        return made[-1]

    yield make
    for s in made:
        s.close()


def spec_for(home: Path, sshd: SSHD | None, **kw: Any) -> ConnectSpec:
    kw.setdefault("address", "127.0.0.1")
    kw.setdefault("port", sshd.port if sshd else 22)
    kw.setdefault("user", "root")
    kw.setdefault("connect_timeout", 5)
    return ConnectSpec(name="n1", key_files=(str(home.parent / "id_ecdsa"),), **kw)


def connect(spec: ConnectSpec) -> SSHTransport:
    t = SSHTransport(spec, retries=0, backoff=0)
    t.connect()
    return t


def refusal(spec: ConnectSpec) -> str:
    with pytest.raises(ConnectError) as err:
        connect(spec).close()
    return str(err.value)


def known_hosts(home: Path, text: str) -> Path:
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    path = ssh / "known_hosts"
    path.write_text(text)
    return path


# -- finding 5: accept-new always records ---------------------------------------------------
def test_accept_new_creates_ssh_dir_and_known_hosts_then_pins(home: Path, servers: Any) -> None:
    sshd = servers()
    assert not (home / ".ssh").exists()
    connect(spec_for(home, sshd, host_key_policy="accept-new")).close()
    ssh, known = home / ".ssh", home / ".ssh" / "known_hosts"
    assert stat.S_IMODE(ssh.stat().st_mode) == 0o700
    assert stat.S_IMODE(known.stat().st_mode) == 0o600
    assert known.read_text() == sshd.line()
    # the same address with another key is refused, even with accept-new
    sshd.key = new_key()
    text = refusal(spec_for(home, sshd, host_key_policy="accept-new"))
    assert "HOST KEY CHANGED for 127.0.0.1" in text
    assert known.read_text().count("\n") == 1


def test_accept_new_appends_to_a_file_without_final_newline(home: Path, servers: Any) -> None:
    sshd = servers()
    known = known_hosts(home, "# ours, keep me\nother.example ssh-ed25519 AAAA")
    connect(spec_for(home, sshd, host_key_policy="accept-new")).close()
    assert known.read_text().splitlines() == ["# ours, keep me", "other.example ssh-ed25519 AAAA",
                                              sshd.line().strip()]


def test_accept_new_refuses_when_the_key_cannot_be_recorded(home: Path, servers: Any) -> None:
    sshd = servers()
    text = refusal(spec_for(home, sshd, host_key_policy="accept-new",
                            known_hosts_files=("/dev/null",)))
    assert "cannot record the host key" in text and "/dev/null is not a regular file" in text
    assert not sshd.users  # refused before logging in


# -- finding 9: every bastion gets the same policy; errors name it --------------------------
def ssh_config(home: Path, text: str) -> None:
    (home / ".ssh").mkdir(mode=0o700, exist_ok=True)
    (home / ".ssh" / "config").write_text(text)


def test_ssh_config_proxyjump_bastion_is_checked(home: Path, servers: Any) -> None:
    target, bastion = servers(), servers()
    ssh_config(home, f"Host lab-target\n  HostName 127.0.0.1\n"
                     f"  ProxyJump jump@127.0.0.1:{bastion.port}\n")
    spec = spec_for(home, target, address="lab-target")
    known = known_hosts(home, target.line())
    text = refusal(spec)  # bastion unknown
    assert f"host key of bastion 127.0.0.1 (ProxyJump jump@127.0.0.1:{bastion.port} from " \
           "~/.ssh/config, for lab-target) is unknown" in text
    assert not bastion.users and not target.users
    known.write_text(target.line() + bastion.line(new_key()))  # bastion key changed
    text = refusal(spec)
    assert "HOST KEY CHANGED for bastion 127.0.0.1" in text
    known.write_text(target.line() + bastion.line())
    connect(spec).close()
    assert bastion.users == ["jump"] and bastion.tunnels == [("127.0.0.1", target.port)]
    assert target.users == ["root"]


def test_inventory_jump_error_names_the_bastion(home: Path, servers: Any) -> None:
    target, bastion = servers(), servers()
    known_hosts(home, target.line())
    text = refusal(spec_for(home, target, proxy_jump=f"jump@127.0.0.1:{bastion.port}"))
    assert text.startswith("n1: host key of bastion 127.0.0.1 (ProxyJump jump@127.0.0.1:")
    assert "is unknown" in text
    assert f"ssh-keyscan -p {bastion.port} 127.0.0.1" in text  # the bastion's, not the target's


def test_bastion_accept_new_records_the_bastion_too(home: Path, servers: Any) -> None:
    target, bastion = servers(), servers()
    connect(spec_for(home, target, proxy_jump=f"127.0.0.1:{bastion.port}",
                     host_key_policy="accept-new")).close()
    lines = (home / ".ssh" / "known_hosts").read_text().splitlines()
    assert sorted(lines) == sorted([target.line().strip(), bastion.line().strip()])


def test_proxyjump_list_goes_through_each_bastion_in_order(home: Path, servers: Any) -> None:
    target, first, second = servers(), servers(), servers()
    known_hosts(home, target.line() + first.line() + second.line())
    connect(spec_for(home, target, proxy_jump=f"a@127.0.0.1:{first.port},"
                                              f"b@127.0.0.1:{second.port}")).close()
    assert first.tunnels == [("127.0.0.1", second.port)]
    assert second.tunnels == [("127.0.0.1", target.port)]
    assert (first.users, second.users, target.users) == (["a"], ["b"], ["root"])


# -- finding 10: known_hosts handling ---------------------------------------------------------
def test_only_the_named_known_hosts_files_count(home: Path, servers: Any, tmp_path: Path
                                                ) -> None:
    sshd = servers()
    custom = tmp_path / "lab_known_hosts"
    custom.write_text(sshd.line())
    known_hosts(home, sshd.line(new_key()))  # stale: must not win over the named file
    connect(spec_for(home, sshd, known_hosts_files=(str(custom),))).close()
    # and a key only in ~/.ssh/known_hosts is not trusted when another file is named
    known_hosts(home, sshd.line())
    custom.write_text("")
    text = refusal(spec_for(home, sshd, known_hosts_files=(str(custom),)))
    assert "is unknown" in text and str(custom) in text


def test_revoked_key_is_refused(home: Path, servers: Any) -> None:
    sshd = servers()
    known = known_hosts(home, sshd.line() + f"@revoked * {sshd.key.get_name()} "
                                            f"{sshd.key.get_base64()}\n")
    for policy in ("yes", "accept-new", "no"):
        text = refusal(spec_for(home, sshd, host_key_policy=policy))
        assert "host key of 127.0.0.1 is REVOKED" in text and f"{known}:2" in text
    # another key revoked, and hashed and wildcard lines around: the right key connects
    hashed = paramiko.HostKeys.hash_host(sshd.name)
    other = new_key()
    known.write_text(f"@revoked [127.0.0.1]:* {other.get_name()} {other.get_base64()}\n"
                     + sshd.line(name=hashed))
    connect(spec_for(home, sshd)).close()
    # a revoked key in a wildcard line is refused too
    known.write_text(sshd.line(name="[127.0.0.?]:*")
                     + f"@revoked 127.0.0.1,[127.0.0.1]:* {sshd.key.get_name()} "
                       f"{sshd.key.get_base64()}\n")
    assert "REVOKED" in refusal(spec_for(home, sshd))


def test_a_connection_dropped_during_authentication_is_retried(home: Path,
                                                               servers: Any) -> None:
    """sshd going down for a reboot can take the TCP connection and drop it mid-auth
    (paramiko: "Authentication failed: transport shut down or saw EOF"): that host is still
    rebooting, not refusing the key (CI's test_day2 upgrade failed on it once). A key the
    server rejects stays a refusal, never retried."""
    sshd = servers()
    known_hosts(home, sshd.line())
    # an ed25519 key in OpenSSH's format, as the lab's: paramiko then reports the server's
    # answer (with a PEM ECDSA key it reports its last key-format guess instead)
    key = home.parent / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    spec = replace(spec_for(home, sshd), key_files=(str(key),))
    sshd.drop_auth = 2
    t = SSHTransport(spec, retries=2, backoff=0)
    t.connect()
    assert t.run("true").exit_code == 0 and sshd.drop_auth == 0
    t.close()
    sshd.drop_auth = 3
    with pytest.raises(ConnectError, match="connection closed during authentication"):
        SSHTransport(spec, retries=2, backoff=0).connect()
    sshd.reject = True
    tries = len(sshd.users)
    with pytest.raises(ConnectError, match=r"authentication failed for root@127\.0\.0\.1: "
                                           r"Authentication failed\.$"):
        SSHTransport(spec, retries=2, backoff=0).connect()
    assert len(sshd.users) == tries + 1   # refused once, never retried


def test_a_drop_right_after_the_key_was_accepted_is_a_drop_not_a_refusal() -> None:
    """sshd going down can accept the key and close at once; paramiko then raises its
    "transport shut down or saw EOF" with the handler already authenticated. That is a host
    going away (retried), never a refused key (a lab bootstrap's reconnect failed on it)."""
    from gpuk8s.transport import ssh_errors

    class Handler:
        banner = None

        def is_authenticated(self) -> bool:
            return True

    class Transport:
        auth_handler = Handler()

        def is_active(self) -> bool:
            return False

    class Client:
        def get_transport(self) -> Transport:
            return Transport()

    class Conn:
        client = Client()

        def open(self) -> None:
            raise paramiko.AuthenticationException(
                "Authentication failed: transport shut down or saw EOF")

    with pytest.raises(ssh_errors._ClosedInAuth):
        ssh_errors._open_telling_drops(Conn())


#: what systemd writes to /run/nologin at boot, and pam_nologin sends to every user but root
NOLOGIN = ("System is booting up. Unprivileged users are not permitted to log in yet. Please "
           "come back later. For technical details, see pam_nologin(8).")


def test_a_booting_host_is_waited_for_saying_so(home: Path, servers: Any) -> None:
    """Right after a boot, sshd lets root in but refuses every other user with pam_nologin's
    banner and closes the connection. gpuk8s used to retry three times in about three seconds
    and give up with "connection closed during authentication"; it waits (up to the connect
    timeout, from the first refusal) and says so on the terminal."""
    sshd = servers()
    known_hosts(home, sshd.line())
    sshd.nologin = NOLOGIN
    connect(spec_for(home, sshd)).close()  # root is let in while the host boots
    threading.Timer(4.5, lambda: setattr(sshd, "nologin", None)).start()
    said: list[str] = []
    started = time.monotonic()
    t = SSHTransport(spec_for(home, sshd, user="ops", connect_timeout=8), notify=said.append)
    t.connect()
    assert 4.0 < time.monotonic() - started < 8.0
    assert t.run("true").exit_code == 0
    t.close()
    assert len(said) == 1, said
    assert said[0].startswith("n1: ops@127.0.0.1 was refused after its key was accepted; "
                              f"sshd said: {NOLOGIN!r}. Waiting up to 8s (the connect "
                              "timeout) for the host to finish booting")


def test_a_host_still_booting_after_the_connect_timeout_shows_the_banner(
        home: Path, servers: Any) -> None:
    sshd = servers()
    known_hosts(home, sshd.line())
    sshd.nologin = NOLOGIN
    said: list[str] = []
    started = time.monotonic()
    with pytest.raises(ConnectError) as err:
        SSHTransport(spec_for(home, sshd, user="ops", connect_timeout=2),
                     notify=said.append).connect()
    assert time.monotonic() - started < 5
    text = str(err.value)
    assert f"ops@127.0.0.1:{sshd.port}: the server accepted the key, then closed the " \
           f"connection, saying: {NOLOGIN!r}; still so after " in text
    assert "(the connect timeout, 2s). pam_nologin refuses every user but root" in text
    assert "systemctl is-system-running --wait" in text and len(said) == 1


def test_a_refused_key_error_carries_the_servers_banner(home: Path, servers: Any) -> None:
    sshd = servers()
    known_hosts(home, sshd.line())
    sshd.reject = True
    sshd.banner = "Authorized users only. Keys are managed at https://keys.example\n"
    # an OpenSSH-format key: paramiko then reports the server's answer (see above)
    key = home.parent / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    text = refusal(replace(spec_for(home, sshd, user="ops"), key_files=(str(key),)))
    assert text.endswith("Authentication failed. The server said: 'Authorized users only. "
                         "Keys are managed at https://keys.example'"), text
    # a PEM key: paramiko's own error is its next key-type guess ("encountered EC key,
    # expected OPENSSH key"); the refusal is still named as one
    assert refusal(spec_for(home, sshd, user="ops")) == text


def test_a_closed_port_is_said_in_words_not_errno_none(home: Path) -> None:
    """paramiko's NoValidConnectionsError prints as "[Errno None] Unable to connect to port
    ..."; the error names each address's cause instead."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    text = refusal(spec_for(home, None, port=port))
    assert "Errno" not in text
    assert text == (f"n1: cannot connect to 127.0.0.1:{port}: 127.0.0.1 port {port}: "
                    "connection refused (nothing listens there: is sshd running, is the port "
                    "right?)")
    assert ssh_describe(OSError(None, "Socket is closed")) == "Socket is closed"
    assert ssh_describe(paramiko.SSHException("[Errno None] odd")) == "odd"
    assert ssh_describe(TimeoutError("timed out"), 10) == \
        "no answer within 10s (the connect timeout)"
    assert ssh_describe(socket.gaierror(-2, "Name or service not known")) == \
        "the address does not resolve (Name or service not known)"


def test_wildcard_known_hosts_lines_match_like_ssh(home: Path, servers: Any) -> None:
    sshd = servers()
    known = known_hosts(home, sshd.line(name="[127.0.0.*]:*"))
    connect(spec_for(home, sshd)).close()
    known.write_text(sshd.line(new_key(), name="[127.0.0.*]:*"))
    assert "HOST KEY CHANGED" in refusal(spec_for(home, sshd, host_key_policy="accept-new"))
    known.write_text(sshd.line(name=f"[127.0.0.*]:*,!{sshd.name}"))  # negated: no match
    assert "is unknown" in refusal(spec_for(home, sshd))


def test_cert_authority_line_is_a_clear_refusal_not_a_crash(home: Path, servers: Any) -> None:
    sshd = servers()
    ca = new_key()
    known = known_hosts(home, f"@cert-authority [127.0.0.1]:* {ca.get_name()} "
                              f"{ca.get_base64()}\n")
    for policy in ("yes", "accept-new"):
        text = refusal(spec_for(home, sshd, host_key_policy=policy))
        assert "@cert-authority" in text and "cannot check SSH host certificates" in text
        assert f"{known}:1" in text
    assert known.read_text().count("\n") == 1  # accept-new did not record around the CA
    known.write_text(known.read_text() + sshd.line())  # the host's own key: fine
    connect(spec_for(home, sshd)).close()


def test_hostile_known_hosts_lines_are_skipped(home: Path, servers: Any) -> None:
    sshd = servers()
    known_hosts(home, "@revoked\n@cert-authority *\n@weird * ssh-rsa AAAA\n"
                      "garbage\n[127.0.0.1]:1 ssh-rsa !!notbase64!!\n"
                      "x ssh-unknown-type AAAAB3Nza\n|1|bad|hash ssh-rsa AAAA\n\n#c\n"
                      + sshd.line())
    connect(spec_for(home, sshd)).close()


def test_no_policy_never_rewrites_known_hosts(home: Path, servers: Any) -> None:
    sshd = servers()
    other = new_key()
    text = (f"# team-managed, do not edit\n@cert-authority *.lab {other.get_name()} "
            f"{other.get_base64()}\nother.example {other.get_name()} {other.get_base64()}\n")
    known = known_hosts(home, text)
    before = known.stat().st_mtime_ns
    t = connect(spec_for(home, sshd, host_key_policy="no"))
    t.close()
    assert known.read_text() == text and known.stat().st_mtime_ns == before


def test_open_all_never_loses_a_host(home: Path) -> None:
    def opener(spec: ConnectSpec, redact: Redactor) -> Any:
        if spec.name == "bad":
            raise paramiko.hostkeys.InvalidHostKey("@revoked x", ValueError("boom"))
        if spec.name == "worse":
            raise RuntimeError("library bug")
        return object()

    specs = [ConnectSpec(name=n, address="10.0.0.1") for n in ("ok", "bad", "worse")]
    transports, errors = open_all(specs, Redactor(), opener)
    assert list(transports) == ["ok"]
    assert sorted(errors) == ["bad", "worse"]
    assert all(isinstance(e, ConnectError) for e in errors.values())
    assert "InvalidHostKey" in str(errors["bad"]) and "RuntimeError: library bug" in str(
        errors["worse"])


# -- finding 11: the sudo password only where sudo asks for it ------------------------------
def sudo_host(nopasswd: bool) -> Handler:
    def handler(command: str, stdin: bytes) -> tuple[int, bytes | list[bytes]]:
        if command == "sudo -k -n -- sh -c true":
            return (0, b"") if nopasswd else (1, b"sudo: a password is required\n")
        return 0, b"0\n"
    return handler


def test_password_never_sent_where_sudo_needs_none(home: Path, servers: Any) -> None:
    sshd = servers(sudo_host(nopasswd=True))
    known_hosts(home, sshd.line())
    t = connect(spec_for(home, sshd, user="ops", become=True, become_password=PASSWORD))
    t.check_sudo()
    t.run("echo again")
    t.close()
    assert [e.command for e in sshd.execs] == ["sudo -k -n -- sh -c true", "sudo -n -- sh -s",
                                               "sudo -n -- sh -s"]
    assert all(PASSWORD.encode() not in e.stdin for e in sshd.execs)


def test_password_on_stdin_where_sudo_asks(home: Path, servers: Any) -> None:
    sshd = servers(sudo_host(nopasswd=False))
    known_hosts(home, sshd.line())
    t = connect(spec_for(home, sshd, user="ops", become=True, become_password=PASSWORD))
    t.check_sudo()
    t.close()
    assert [e.command for e in sshd.execs] == ["sudo -k -n -- sh -c true",
                                               "sudo -k -S -p '' -- sh -s"]
    assert sshd.execs[0].stdin == b""
    assert sshd.execs[1].stdin == f"{PASSWORD}\nid -u".encode()


def test_password_with_a_line_break_is_refused(home: Path, servers: Any) -> None:
    sshd = servers()
    for bad in ("pw\nid", "pw\r"):
        spec = spec_for(home, sshd, user="ops", become=True, become_password=bad)
        text = refusal(spec)
        assert "contains a line break" in text and "GPUK8S_BECOME_PASSWORD" in text
        assert bad not in text
        with pytest.raises(ConnectError, match="line break"):
            LocalTransport(spec).connect()
    assert not sshd.users


@pytest.fixture
def sudo_shim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[int], Path]:
    """A fake ``sudo`` first on PATH: logs each argv as [arg][arg], then runs the command
    after ``--`` (as sudo does where it needs no password); the probe exits ``probe_rc``."""
    def make(probe_rc: int) -> Path:
        folder = tmp_path / "shim"
        folder.mkdir(exist_ok=True)
        log = folder / "argv.log"
        (folder / "sudo").write_text(
            '#!/bin/sh\nfor a; do printf "[%s]" "$a"; done >> "$SUDO_LOG"; echo >> "$SUDO_LOG"\n'
            f'[ "$*" = "-k -n -- sh -c true" ] && exit {probe_rc}\n'
            'while [ "$1" != "--" ]; do shift; done; shift; exec "$@"\n')
        (folder / "sudo").chmod(0o755)
        monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
        monkeypatch.setenv("SUDO_LOG", str(log))
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
        return log
    return make


def test_local_transport_never_feeds_the_password_to_sh(sudo_shim: Any) -> None:
    log = sudo_shim(0)
    t = LocalTransport(ConnectSpec(name="me", address="localhost", user="ops", become=True,
                                   become_password=PASSWORD, local=True))
    result = t.run("echo ran")
    assert result.stdout == "ran\n"  # no "s3cret: not found", no `id -un` output
    assert log.read_text().splitlines() == ["[-k][-n][--][sh][-c][true]", "[-n][--][sh][-s]"]


def test_local_transport_argv_is_a_list(sudo_shim: Any) -> None:
    log = sudo_shim(1)
    t = LocalTransport(ConnectSpec(name="me", address="localhost", user="ops", become=True,
                                   become_password=PASSWORD, local=True))
    t.run("true")
    # sudo gets an empty prompt argument, not the two characters ''
    assert "[-k][-S][-p][][--][sh][-s]" in log.read_text().splitlines()


#: a sudo that acts on a sudoers granting ``sh`` NOPASSWD and everything else only with a
#: password (review 2, residual of #11): ``sh`` runs at once, its stdin untouched (the real
#: sudo reads no password there); any other command, or -S for a command other than sh, wants
#: the password. Logs each argv as [arg][arg] to $SUDO_LOG.
SH_ONLY_SUDO = r"""#!/bin/sh
for a; do printf "[%s]" "$a"; done >> "$SUDO_LOG"; echo >> "$SUDO_LOG"
stdin_pw=0; nonint=0
while [ "$1" != "--" ]; do
  case $1 in -S) stdin_pw=1;; -n) nonint=1;; esac; shift
done
shift
case $1 in
  sh|/bin/sh|/usr/bin/sh) exec "$@";;
esac
[ "$nonint" = 1 ] && { echo "sudo: a password is required"; exit 1; }
if [ "$stdin_pw" = 1 ]; then IFS= read -r pw; [ "$pw" = "$SUDO_PW" ] || exit 1; exec "$@"; fi
exit 1
"""


@pytest.fixture
def sh_only_sudo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "sh-only"
    folder.mkdir()
    (folder / "sudo").write_text(SH_ONLY_SUDO)
    (folder / "sudo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    monkeypatch.setenv("SUDO_LOG", str(folder / "argv.log"))
    monkeypatch.setenv("SUDO_PW", PASSWORD)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    return folder / "argv.log"


def test_the_sudo_probe_asks_about_sh_the_command_the_scripts_run(
        sh_only_sudo: Path) -> None:
    """Review 2, residual note on #11: a sudoers granting ``sh`` without a password but not
    ``true`` made the old probe (``sudo -k -n -- true``) fail, so the password was sent, and
    root's sh (which sudo started without reading it) ran the password as a command line. The
    probe asks about ``sh`` itself; the scripts run in a real shell here."""
    t = LocalTransport(ConnectSpec(name="me", address="localhost", user="ops", become=True,
                                   become_password=PASSWORD, local=True))
    result = t.run("echo ran")
    assert result.stdout == "ran\n", result.stdout  # no "s3cret: not found", no `id -un`
    assert sh_only_sudo.read_text().splitlines() == ["[-k][-n][--][sh][-c][true]",
                                                     "[-n][--][sh][-s]"]


def test_the_sudo_probe_over_ssh_runs_in_a_real_shell(home: Path, servers: Any,
                                                       sh_only_sudo: Path) -> None:
    """The same sudoers behind sshd: each command line runs in a real ``sh -c`` with that
    sudo first on PATH, as sshd runs it."""
    def real_shell(command: str, stdin: bytes) -> tuple[int, bytes | list[bytes]]:
        proc = subprocess.run(["sh", "-c", command], input=stdin, capture_output=True,
                              timeout=30, check=False)
        return proc.returncode, proc.stdout + proc.stderr

    sshd = servers(real_shell)
    known_hosts(home, sshd.line())
    t = connect(spec_for(home, sshd, user="ops", become=True, become_password=PASSWORD))
    t.check_sudo()
    assert t.run("echo ran").stdout == "ran\n"
    t.close()
    assert all(PASSWORD.encode() not in e.stdin for e in sshd.execs)
    assert [e.command for e in sshd.execs] == ["sudo -k -n -- sh -c true", "sudo -n -- sh -s",
                                               "sudo -n -- sh -s"]


# -- finding 11 (inventory): where a password may come from -----------------------------------
INVENTORY = ("all:\n  children:\n    control_plane:\n      hosts:\n"
             "        cp-01: {ansible_user: ubuntu}\n")


@pytest.mark.parametrize("key", ["ansible_become_password", "ansible_become_pass",
                                 "ansible_sudo_pass"])
def test_become_password_is_refused_from_set(tmp_path: Path, key: str) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(INVENTORY)
    for overrides in ([f"{key}=hunter2-x"], {key: "hunter2-x"}):
        problems = validate_all(path, overrides=overrides, env={})
        assert len(problems) == 1
        text = str(problems[0])
        assert f"{key} cannot be given with --set" in text and "hunter2-x" not in text
        assert "host_vars" in text and "GPUK8S_BECOME_PASSWORD" in text
        assert "--ask-become-pass" in text


def test_become_password_with_a_line_break_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text("all:\n  vars:\n    ansible_become_password: |\n      s3cret\n"
                    + INVENTORY[len("all:\n"):])
    text = str(validate_all(path, env={})[0])
    assert "ansible_become_password contains a line break" in text and "s3cret" not in text
    path.write_text(INVENTORY)
    text = str(validate_all(path, env={"GPUK8S_BECOME_PASSWORD": "s3cret\nid"})[0])
    assert "GPUK8S_BECOME_PASSWORD contains a line break" in text and "s3cret" not in text
    inv = load_inventory(path, env={"GPUK8S_BECOME_PASSWORD": "fine pw"})
    assert inv.hosts["cp-01"].become_password is not None


# -- finding 14: a cap on one command's output ------------------------------------------------
def test_output_is_capped_per_command(home: Path, servers: Any,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def handler(command: str, stdin: bytes) -> tuple[int, bytes | list[bytes]]:
        if b"flood" in stdin:
            return 0, [b"x" * 65536] * 64  # 4 MiB
        return 0, b"y" * (1024 * 1024)  # exactly at the limit: fine

    assert base._size(tr.MAX_OUTPUT_BYTES) == "64 MiB"
    # the SSH transport reads the cap where it reads the channel
    monkeypatch.setattr("gpuk8s.transport.ssh.MAX_OUTPUT_BYTES", 1024 * 1024)
    sshd = servers(handler)
    known_hosts(home, sshd.line())
    t = connect(spec_for(home, sshd))
    with pytest.raises(OutputTooLarge) as err:
        t.run("flood")
    assert isinstance(err.value, ConnectError)
    assert str(err.value).startswith("n1: output of a command exceeded 1 MiB;")
    assert "MAX_OUTPUT_BYTES" in str(err.value)
    assert len(t.run("ok").stdout) == 1024 * 1024  # the connection still works
    t.close()
