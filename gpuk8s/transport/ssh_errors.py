"""What an SSH connection attempt's failure means, in words a person reads: the server's
banner in an authentication error, a login refused while the host boots (pam_nologin), and
network errors without paramiko's "[Errno None]"."""

from __future__ import annotations

import os
import re
from typing import Any

from gpuk8s.transport.base import ConnectSpec

#: paramiko's AuthenticationException text when the connection closed during authentication
#: (auth_handler.py), as opposed to the server refusing the key ("Authentication failed.")
_DROPPED_IN_AUTH = "transport shut down or saw EOF"
#: how often a host whose sshd refuses logins while it boots is tried again
BOOT_POLL_S = 1.0


class _ClosedInAuth(Exception):
    """The server closed the connection during authentication. With a banner (``said``), it
    refused the login after the key was accepted: sshd's PAM account check (pam_nologin while
    the host boots: "System is booting up. Unprivileged users are not permitted to log in
    yet"); without one, sshd went down under the handshake (a reboot)."""

    def __init__(self, said: str) -> None:
        super().__init__(f"connection closed during authentication ({_DROPPED_IN_AUTH})"
                         + (f"; the server said: {said!r}" if said else ""))
        self.said = said


def _server_banner(conn: Any) -> str:
    """The text the server sent as an SSH authentication banner on this connection (sshd's
    ``Banner``, or PAM's message when its account check refused the login), on one line; ""
    when it sent none."""
    try:
        raw = conn.client.get_transport().auth_handler.banner
    except AttributeError:
        return ""
    if not raw:
        return ""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    return " ".join(text.split())[:600]


def _open_telling_drops(conn: Any) -> None:
    """``conn.open()``; a connection that closed under the authentication comes out as
    _ClosedInAuth (with the server's banner, if any), not as the AuthenticationException of a
    refused key; a refused key's error carries the server's banner too.

    Once authentication was tried, the transport's state says what happened, not paramiko's
    exception: with a key file in PEM format paramiko goes on to try the file as the next key
    type and reports that guess ("encountered EC key, expected OPENSSH key") instead."""
    import paramiko

    try:
        conn.open()
    except paramiko.BadHostKeyException:
        raise
    except paramiko.SSHException as exc:
        if _DROPPED_IN_AUTH in str(exc):
            # the connection closed under the authentication, whatever the handler's state:
            # sshd going down for a reboot can send its success and close at once, and
            # paramiko reports the closed transport with the key already accepted (a lab
            # bootstrap's reconnect took that for a refused key)
            raise _ClosedInAuth(_server_banner(conn)) from None
        transport = conn.client.get_transport()
        handler = getattr(transport, "auth_handler", None)
        if transport is None or handler is None or handler.is_authenticated():
            raise  # no authentication was tried: the key files, the handshake
        said = _server_banner(conn)
        if not transport.is_active():
            raise _ClosedInAuth(said) from None
        text = str(exc) if isinstance(exc, paramiko.AuthenticationException) \
            else "Authentication failed."
        raise paramiko.AuthenticationException(
            text + (f" The server said: {said!r}" if said else "")) from None


def describe(exc: BaseException, timeout: float | None = None) -> str:
    """A network or SSH error as a person reads it: never paramiko's "[Errno None]" (its
    NoValidConnectionsError and socket errors without an errno), each address's own cause,
    timeouts with the limit that ran out."""
    import socket

    import paramiko

    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return "; ".join(f"{addr[0]} port {addr[1]}: {describe(err, timeout)}"
                         for addr, err in sorted(exc.errors.items(), key=str))
    if isinstance(exc, socket.gaierror):
        return f"the address does not resolve ({exc.strerror or exc})"
    if isinstance(exc, TimeoutError):
        limit = f" within {timeout:g}s (the connect timeout)" if timeout else ""
        return f"no answer{limit}"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens there: is sshd running, is the port right?)"
    if isinstance(exc, ConnectionResetError):
        return "the server reset the connection"
    if isinstance(exc, EOFError):
        return "the server closed the connection"
    if isinstance(exc, OSError) and exc.errno is not None:
        return (exc.strerror or os.strerror(exc.errno)) + \
            (f" ({exc.filename})" if exc.filename else "")
    if isinstance(exc, OSError):  # errno None: its text is the rest of its arguments
        text = " ".join(str(a) for a in exc.args if a is not None)
    else:
        text = str(exc)
    text = _ERRNO_NONE.sub("", text).strip()
    return text or type(exc).__name__


_ERRNO_NONE = re.compile(r"\[Errno None\]\s*")


def _still_refused(spec: ConnectSpec, said: str, waited: float) -> str:
    """The error of a login refused after the key was accepted, still so after the wait."""
    why = ""
    if "nologin" in said.lower() or "booting" in said.lower():
        why = (" pam_nologin refuses every user but root while /run/nologin exists, from the "
               "start of the boot until systemd-user-sessions.service has run (or while "
               "/etc/nologin exists).")
    return (f"{spec.user}@{spec.address}:{spec.port}: the server accepted the key, then closed "
            f"the connection, saying: {said!r}; still so after {waited:.0f}s (the connect "
            f"timeout, {spec.connect_timeout:g}s).{why} Wait until the host has finished "
            "booting (`systemctl is-system-running --wait` there), or connect as root, then "
            "run gpuk8s again")
