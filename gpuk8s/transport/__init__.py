"""SSH and local connections: the only module that imports fabric and paramiko.

Every command is a POSIX sh script sent on stdin to ``sh -s`` (through ``sudo`` when the login user
is not root), so nothing a script contains, secrets included, appears in a process list. stderr is
merged into stdout; the executor and the probe delimit their sections with markers.

Trust: every hop (the host and each bastion, from the inventory or from ``~/.ssh/config``) has its
host key checked against the same known_hosts files with the same policy. Output from a node is
untrusted text: at most ``MAX_OUTPUT_BYTES`` of it is read per command. The sudo password is sent
only to a host whose sudo asks for one (``sudo -k -n -- sh -c true`` fails there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from gpuk8s.errors import ConnectError
from gpuk8s.parallel import in_parallel
from gpuk8s.redact import Redactor
from gpuk8s.transport.base import (
    MAX_OUTPUT_BYTES,
    CommandResult,
    ConnectSpec,
    Counters,
    OutputTooLarge,
    Transport,
)
from gpuk8s.transport.known_hosts import KnownHosts
from gpuk8s.transport.local import LocalTransport
from gpuk8s.transport.ssh import SSHTransport


def open_transport(spec: ConnectSpec, redact: Redactor,
                   notify: Callable[[str], None] | None = None) -> SSHTransport | LocalTransport:
    """A connected transport for one host (raises ConnectError). ``notify`` gets a line to
    show when connecting waits (a host still booting); the default is stderr."""
    transport: SSHTransport | LocalTransport
    transport = LocalTransport(spec, redact) if spec.local else \
        SSHTransport(spec, redact, notify=notify)
    transport.connect()
    if spec.user != "root" and spec.become:
        transport.check_sudo()
    return transport


def open_all(specs: Iterable[ConnectSpec], redact: Redactor,
             opener: Callable[[ConnectSpec, Redactor], Any] = open_transport,
             ) -> tuple[dict[str, Any], dict[str, ConnectError]]:
    """Connect to every host in parallel; return (transports, errors) keyed by host name."""
    specs = list(specs)
    by_name = {s.name: s for s in specs}
    outcome = in_parallel(by_name, lambda name: opener(by_name[name], redact))
    transports = {n: t for n, t in outcome.items() if not isinstance(t, Exception)}
    # whatever went wrong, the host is reported, never lost
    errors = {n: e if isinstance(e, ConnectError) else ConnectError(n, redact(
        f"cannot connect to {by_name[n].address}:{by_name[n].port}: unexpected "
        f"{type(e).__name__}: {e}")) for n, e in outcome.items() if isinstance(e, Exception)}
    for spec in specs:
        if spec.name not in transports and spec.name not in errors:
            errors[spec.name] = ConnectError(spec.name, "the connection attempt ended without "
                                             "a result (see the messages above)")
    return transports, errors


__all__ = ["MAX_OUTPUT_BYTES", "CommandResult", "ConnectSpec", "Counters", "KnownHosts",
           "LocalTransport", "OutputTooLarge", "SSHTransport", "Transport", "open_all",
           "open_transport"]
