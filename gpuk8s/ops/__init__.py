"""Ops: pure descriptions of a change (shell commands) or of why none is needed."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field

from gpuk8s.sinks import shell


@dataclass(frozen=True)
class Op:
    """One step of a plan. No commands means the desired state already holds (``reason``
    says why); commands are POSIX sh run as root, in order, stopping at the first failure."""

    id: str
    commands: tuple[str, ...] = ()
    reason: str = ""
    notify: tuple[str, ...] = ()
    diff: str | None = None
    #: the commands carry secrets: they are never logged or shown, only the op id and reason
    secret: bool = False
    timeout: float | None = None
    #: ask the executor to reboot the host and wait for it (handlers use this)
    reboot: bool = False
    #: an informational op (a warning); never changes anything
    warning: bool = False
    meta: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def changes(self) -> bool:
        return bool(self.commands) or self.reboot

    @property
    def symbol(self) -> str:
        if self.warning:
            return "!"
        return "+" if self.changes else "="


def noop(op_id: str, reason: str) -> Op:
    return Op(op_id, (), reason)


def change(op_id: str, reason: str, *commands: str, **kwargs: object) -> Op:
    return Op(op_id, tuple(commands), reason, **kwargs)  # type: ignore[arg-type]


def warn(op_id: str, reason: str) -> Op:
    return Op(op_id, (), reason, warning=True)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


#: the shell sink's one helper (gpuk8s.sinks.shell), under the short name ops use
q = shell


def write_file(dest: str, data: bytes, mode: str = "0644", owner: str = "root") -> str:
    """A shell snippet that writes ``data`` to ``dest`` atomically (content travels in the
    script itself as base64, so it never touches argv)."""
    encoded = base64.encodebytes(data).decode()
    parent = dest.rsplit("/", 1)[0] or "/"
    return (f"mkdir -p {q(parent)} && t=$(mktemp {q(dest)}.XXXXXX) && "
            f"base64 -d > \"$t\" <<'GPUK8S_EOF'\n{encoded}GPUK8S_EOF\n"
            f"chown {q(owner)}: \"$t\" && chmod {mode} \"$t\" && mv -f \"$t\" {q(dest)}")
