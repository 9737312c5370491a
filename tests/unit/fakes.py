"""Fakes of a host for tests that drive the executor's scripts without SSH."""

from __future__ import annotations

import re
from typing import Any

from gpuk8s.executor import HostRunner
from gpuk8s.redact import Redactor
from gpuk8s.transport import CommandResult

_BEGIN = re.compile(r'^echo "(@@GPUK8S-OP-[0-9a-f]+) B (\d+) \$\(date \+%s\.%N\)"$', re.M)


def op_bodies(script: str) -> list[str]:
    """The commands of each op in an executor script, in order."""
    return [m.group(1) for m in re.finditer(r"\( set -e\n(.*?)\n\)\nrc=\$\?", script, re.S)]


def sectioned(script: str, output: str, rc: int = 0) -> CommandResult:
    """What a host running the executor's ``script`` prints when every op prints ``output``
    and exits ``rc``."""
    ops = _BEGIN.findall(script)
    text = "".join(f"{marker} B {i} 100.{i}\n{output}\n{marker} E {i} {rc} 100.{i}5\n"
                   for marker, i in ops)
    return CommandResult(rc, text)


def runner_for(transports: dict[str, Any]) -> Any:
    """A Session.runner stand-in over fake transports."""
    return lambda name: HostRunner(name, transports[name], Redactor(), lambda text: None,
                                   lambda *args: None)
