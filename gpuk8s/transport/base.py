"""What every transport shares: a command's result, the redactor, connection settings, the
Transport protocol, the output cap, and how a script is wrapped for sudo."""

from __future__ import annotations

import re
import socket
import threading
from dataclasses import dataclass, field
from typing import Protocol

from gpuk8s.errors import ConnectError

#: Exceptions that mean "the network or sshd is not there (yet)": worth a retry.
_RETRYABLE = (socket.timeout, TimeoutError, ConnectionError, OSError, EOFError)


#: The most output (stdout and stderr together) read from one command. Past it the command
#: fails for its host: a broken or hostile node must not exhaust this machine's memory.
MAX_OUTPUT_BYTES = 64 * 1024 * 1024


#: Bastions in a row (ProxyJump lists, a bastion's own ProxyJump); more means a config loop.
MAX_HOPS = 8


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

    ``nopasswd``: this host's sudo needs no password (the probe succeeded), so the
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


#: Asks whether sudo would run ``sh`` (the command every script runs as) without a password
#: (-k: a cached timestamp does not count, so the answer holds for the whole run). It asks
#: about ``sh`` itself: a sudoers that grants ``sh`` NOPASSWD but another probe command only
#: with a password would otherwise have the password sent to root's sh as a command line.
_SUDO_PROBE = "sudo -k -n -- sh -c true"
