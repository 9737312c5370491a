"""The local connection (``ansible_connection: local``): the same scripts, run here."""

from __future__ import annotations

import os
import subprocess
import time

from gpuk8s.errors import ConnectError
from gpuk8s.redact import Redactor
from gpuk8s.transport.base import _SUDO_PROBE, CommandResult, ConnectSpec, Counters, _check_password


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
