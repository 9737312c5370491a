"""The gpuk8s exception tree: every error we raise on purpose is a Gpuk8sError."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class Gpuk8sError(Exception):
    """Base of every error gpuk8s raises on purpose."""


class InventoryError(Gpuk8sError, ValueError):
    """The inventory (or a values file, or --set) is wrong; says file, line and fix."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 fix: str | None = None) -> None:
        self.message = message
        self.path = path
        self.line = line
        self.fix = fix
        where = f"{path}:{line}: " if path and line else (f"{path}: " if path else "")
        text = f"{where}{message}"
        if fix:
            text += f"\n  fix: {fix}"
        super().__init__(text)


class InventoryProblems(InventoryError):
    """Several problems in one inventory: all of them, in file order (the first one's file,
    line and fix are this error's)."""

    def __init__(self, problems: list[InventoryError]) -> None:
        first = problems[0]
        self.problems = problems
        InventoryError.__init__(self, first.message, path=first.path, line=first.line,
                                fix=first.fix)
        listed = "\n".join(f"- {p}".replace("\n", "\n  ") for p in problems)
        self.args = (f"{len(problems)} problems in the inventory, in file order "
                     f"(`gpuk8s check -i INVENTORY` shows them with the hosts and settings):\n"
                     f"{listed}",)

    def __str__(self) -> str:
        return str(self.args[0])


class ConnectError(Gpuk8sError):
    """A host could not be reached, authenticated, or its host key is not trusted."""

    def __init__(self, host: str, message: str) -> None:
        self.host = host
        super().__init__(f"{host}: {message}")


class ConnectionLost(ConnectError):
    """An open connection dropped under a running command (the host went down or off the
    network). Raised by the transport; the executor names the op that was running."""

    def __init__(self, host: str, cause: str) -> None:
        self.cause = cause
        super().__init__(host, f"connection lost: {cause}")


class FactError(Gpuk8sError):
    """A fact probe produced output we cannot parse."""


class PlanError(Gpuk8sError, ValueError):
    """Variables and facts cannot make a valid plan (bad template, unsupported OS...)."""


class PreflightError(Gpuk8sError):
    """Preflight found problems; ``problems`` maps host -> list of (check, message, fix)."""

    def __init__(self, problems: Mapping[str, list[tuple[str, str, str]]]) -> None:
        self.problems = dict(problems)
        count = sum(len(v) for v in self.problems.values())
        hosts = ", ".join(sorted(self.problems))
        super().__init__(f"preflight found {count} problem(s) on {hosts}; nothing was changed")


class CommandFailed(Gpuk8sError):
    """A command on a host exited non-zero."""

    def __init__(self, host: str, op_id: str, command: str, exit_code: int,
                 stderr_tail: str) -> None:
        self.host = host
        self.op_id = op_id
        self.command = command
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail
        shown = f": {command}" if command else " (full command in the run log)"
        tail = "".join(f"\n    {line}" for line in stderr_tail.splitlines())
        super().__init__(f"{host}: [{op_id}] exited {exit_code}{shown}{tail}")


class PhaseFailed(Gpuk8sError):
    """A phase failed on one or more hosts; ``results`` carries every host's result."""

    def __init__(self, phase: str, results: Mapping[str, Any]) -> None:
        self.phase = phase
        self.results = dict(results)
        failed = sorted(h for h, r in self.results.items() if getattr(r, "error", None))
        lines = [f"phase {phase!r} failed on {len(failed)} host(s): {', '.join(failed)}"]
        for h in failed:
            lines.append(f"  {self.results[h].error}")
        super().__init__("\n".join(lines))


class HostsFailed(PhaseFailed):
    """The run went on without some hosts (``--max-fail``) and finished; ``results`` has each
    failed host's error, ``summary`` what bootstrap would have returned."""

    def __init__(self, results: Mapping[str, Any], summary: Mapping[str, Any]) -> None:
        self.summary = dict(summary)
        super().__init__("run", results)
        failed = sorted(self.results)
        lines = [f"the run finished without {len(failed)} host(s): {', '.join(failed)}"]
        lines += [f"  {self.results[h].error}" for h in failed]
        self.args = ("\n".join(lines),)

    def __str__(self) -> str:
        return str(self.args[0])


class BundleError(Gpuk8sError):
    """``invoke bundle`` could not build the offline bundle (pip could not reach the index, no
    wheel of a dependency for the target...); says what and the fix."""

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        self.message = message
        self.fix = fix
        super().__init__(f"{message}\n  fix: {fix}" if fix else message)


class RunFolderError(Gpuk8sError):
    """A run folder (runs/<time>-<command>/) is missing, or its report.json is absent or not
    valid JSON (``invoke report``); says which, and the fix."""

    def __init__(self, message: str, *, fix: str) -> None:
        self.message = message
        self.fix = fix
        super().__init__(f"{message}\n  fix: {fix}")


class ProjectRootError(Gpuk8sError):
    """GPUK8S_HOME (or, unset, the folder gpuk8s is installed in) is not a gpuk8s checkout:
    roles/, templates/ or the variables' defaults are missing there; says what, and the fix."""

    def __init__(self, message: str, *, fix: str) -> None:
        self.message = message
        self.fix = fix
        super().__init__(f"{message}\n  fix: {fix}")
