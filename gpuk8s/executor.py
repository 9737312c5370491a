"""Apply planned ops: one thread per host, one script per role, handlers, reboots, barriers."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuk8s.errors import CommandFailed, ConnectError, ConnectionLost, Gpuk8sError
from gpuk8s.ops import Op
from gpuk8s.parallel import in_parallel
from gpuk8s.redact import Redactor
from gpuk8s.sections import section_times, split_sections
from gpuk8s.transport import CommandResult, Transport

PREAMBLE = ("exec 2>&1\nexport LC_ALL=C DEBIAN_FRONTEND=noninteractive "
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n")


@dataclass(frozen=True)
class RoleWork:
    """One role's ops on one host, and the handlers its changed ops may notify."""

    role: str
    ops: tuple[Op, ...]
    handlers: Mapping[str, Op] = field(default_factory=dict)


@dataclass
class OpResult:
    host: str
    op: Op
    status: str  # "changed" | "ok" | "failed" | "warning"
    elapsed: float = 0.0
    output: str = ""
    #: when the op started (time.monotonic() on this machine; 0.0 = it ran nothing)
    started: float = 0.0


@dataclass
class HostResult:
    host: str
    results: list[OpResult] = field(default_factory=list)
    error: Gpuk8sError | None = None
    elapsed: float = 0.0
    #: when the host's work in the phase started (time.monotonic(); 0.0 = it had none)
    started: float = 0.0

    @property
    def changed(self) -> int:
        return sum(r.status == "changed" for r in self.results)

    @property
    def ok(self) -> int:
        return sum(r.status == "ok" for r in self.results)

    @property
    def failed(self) -> int:
        return sum(r.status == "failed" for r in self.results)


#: callback(host, event, text): "op" (an op starts; its id) / "handler" / "reboot" (its id) /
#: "back" (up again after a reboot; the seconds it took) / "fail" / "done"
Listener = Callable[[str, str, str], None]


def build_script(ops: Sequence[Op], marker: str, *, keep_going: bool = False) -> str:
    """One script running the ops in order, each delimited, stopping at the first failure
    (with ``keep_going``, every op runs whatever the others' exit codes). Each marker line
    ends with the node's clock (``date +%s.%N``), so every op's own time is known."""
    parts = [PREAMBLE]
    stop = "" if keep_going else " [ $rc -eq 0 ] || exit $rc;"
    for i, op in enumerate(ops):
        body = "\n".join(op.commands)
        parts.append(f"echo \"{marker} B {i} $(date +%s.%N)\"\n( set -e\n{body}\n)\n"
                     f"rc=$?; echo \"\n{marker} E {i} $rc $(date +%s.%N)\";{stop}\n")
    return "".join(parts)


class _OpStarts:
    """Feeds the listener an "op" event as each op's begin marker streams in (transports that
    stream output call it per chunk); returns nothing, keeps no output."""

    def __init__(self, host: str, ops: Sequence[Op], marker: str, listener: Listener) -> None:
        self.host, self.ops, self.listener = host, ops, listener
        self.pattern = (marker + " B ").encode()
        self.tail = b""

    def __call__(self, chunk: bytes) -> None:
        data = self.tail + chunk
        start = 0
        while (i := data.find(self.pattern, start)) >= 0:
            end = data.find(b" ", i + len(self.pattern))
            if end < 0:
                break
            index = data[i + len(self.pattern):end]
            if index.isdigit() and int(index) < len(self.ops):
                self.listener(self.host, "op", self.ops[int(index)].id)
            start = end
        self.tail = data[max(start, len(data) - len(self.pattern) - 8):]


def _tail(text: str, lines: int = 20) -> str:
    """The last lines of an op's output; only the op's own explanation when it gave one (lines
    starting "gpuk8s: error: "), so a known failure reads as one clear message."""
    explained = [ln for ln in text.splitlines() if ln.startswith("gpuk8s: error: ")]
    if explained:
        return "\n".join(explained[-3:])
    return "\n".join(text.rstrip().splitlines()[-lines:])


class HostRunner:
    """Applies a host's role work through its transport."""

    def __init__(self, host: str, transport: Transport, redact: Redactor,
                 log: Callable[[str], None], listener: Listener,
                 reboot_timeout: float = 600.0,
                 record: Callable[[str, Op, int, float], None] | None = None) -> None:
        self.host = host
        self.transport = transport
        self.redact = redact
        self.log = log
        self.listener = listener
        self.reboot_timeout = reboot_timeout
        #: record(host, op, exit code, seconds) for each op run outside a phase (report.json)
        self.record = record

    def run_ops(self, ops: Sequence[Op], result: HostResult) -> list[Op]:
        """Run ops that change something as one script; record every op; return changed ones."""
        todo = [op for op in ops if op.commands]
        for op in ops:
            if not op.commands and not op.reboot:
                result.results.append(OpResult(self.host, op,
                                               "warning" if op.warning else "ok"))
        if not todo:
            return []
        started = time.monotonic()
        res, sections, times = self._send(todo, events=True)
        elapsed = time.monotonic() - started
        first = min((t[0] for t in times.values()), default=0.0)

        def took(i: int) -> tuple[float, float]:
            """(start on this machine's clock, seconds) of op i; spread evenly without times"""
            if i in times and times[i][1] is not None:
                begin, end = times[i]
                # the node's clock may step (NTP, a reboot): keep each op inside the script
                offset = min(max(0.0, begin - first), elapsed)
                return started + offset, min(max(0.0, (end or begin) - begin), elapsed - offset)
            return started + elapsed * i / len(todo), elapsed / len(todo)
        if res.exit_code == -1 and any(code is None for _, code in sections.values()):
            # the channel closed with no exit status: the host went away under the script
            current = todo[max(sections)].id if sections else todo[0].id
            self.log(self.redact(res.stdout.rstrip()[-2000:]))
            raise ConnectError(self.host, f"connection lost while running [{current}] "
                               f"(after {elapsed:.0f}s): the host went down or off the network")
        changed: list[Op] = []
        for i, op in enumerate(todo):
            text, code = sections.get(i, ("", None))
            text = self.redact(text)
            if text:
                self.log(text)
            at, seconds = took(i)
            if code == 0:
                result.results.append(OpResult(self.host, op, "changed", seconds, text, at))
                changed.append(op)
                continue
            if code is None and i not in sections:
                break  # never started: an earlier op failed
            exit_code = code if code is not None else res.exit_code
            joined = "; ".join(op.commands)
            shown = "" if op.secret or len(joined) > 160 or "\n" in joined else \
                self.redact(joined)
            result.results.append(OpResult(self.host, op, "failed", seconds, text, at))
            raise CommandFailed(self.host, op.id, shown, exit_code,
                                _tail(text or self.redact(res.stdout)))
        if res.exit_code != 0 and len(changed) == len(todo):
            raise CommandFailed(self.host, todo[-1].id, "(script)", res.exit_code,
                                _tail(self.redact(res.stdout)))
        return changed

    def _send(self, ops: Sequence[Op], *, keep_going: bool = False, events: bool = False
              ) -> tuple[CommandResult, dict[int, tuple[str, int | None]],
                         dict[int, tuple[float, float | None]]]:
        """Log the ops, run them as one script, return the result, its sections and each op's
        (start, end) on the node's clock; with ``events``, tell the listener as each op
        starts (as the output streams in, where the transport streams; else all at once). A
        connection that drops under the script is a ConnectError naming the first op."""
        marker = "@@GPUK8S-OP-" + secrets.token_hex(6)
        for op in ops:
            self.log(f"--> {op.id}: {op.reason}")
            if not op.secret:
                self.log(self.redact("\n".join(op.commands)))
        streams = events and hasattr(self.transport, "on_output")
        if streams:
            self.transport.on_output = _OpStarts(  # type: ignore[attr-defined]
                self.host, ops, marker, self.listener)
        elif events:
            for op in ops:
                self.listener(self.host, "op", op.id)
        started = time.monotonic()
        try:
            res = self.transport.run(build_script(ops, marker, keep_going=keep_going),
                                     timeout=max((op.timeout or 900.0) for op in ops))
        except ConnectionLost as exc:
            raise ConnectError(self.host, f"connection lost while running [{ops[0].id}] "
                               f"(after {time.monotonic() - started:.0f}s): the host went "
                               f"down or off the network ({exc.cause})") from None
        finally:
            if streams:
                self.transport.on_output = None  # type: ignore[attr-defined]
        return res, split_sections(res.stdout, marker), section_times(res.stdout, marker)

    def run_now(self, ops: Sequence[Op], *, keep_going: bool = False
                ) -> list[tuple[int, str]]:
        """Run ``ops`` now, outside a phase (day-2 steps, workloads, hand-offs), as one script
        built, logged and redacted as a phase's ops are; return each op's (exit code, output).

        The output comes back as the host printed it (a hand-off may carry a secret, such as
        admin.conf); the log gets it redacted, and gets nothing of a secret op. An op that
        never ran reads as exit code -1. Without ``keep_going`` the first failure raises
        CommandFailed naming the op, as in a phase."""
        started = time.monotonic()
        res, sections, _times = self._send(ops, keep_going=keep_going)
        took = time.monotonic() - started
        out: list[tuple[int, str]] = []
        for i, op in enumerate(ops):
            text, code = sections.get(i, ("", None))
            if self.record is not None:
                self.record(self.host, op, -1 if code is None else code, took / len(ops))
            if text and not op.secret:
                self.log(self.redact(text))
            if code is None and i in sections and res.exit_code == -1:
                raise ConnectError(self.host, f"connection lost while running [{op.id}]: the "
                                   "host went down or off the network")
            rc = -1 if code is None else code
            self.log(f"<-- {op.id}: exit {rc}")
            if rc != 0 and not keep_going:
                raise CommandFailed(self.host, op.id, "", rc, _tail(self.redact(text)))
            out.append((rc, text))
        return out

    def reboot(self, op: Op, result: HostResult) -> None:
        self.listener(self.host, "reboot", op.id)
        self.log(f"--> {op.id}: rebooting")
        started = time.monotonic()
        boot = self.transport.run("cat /proc/sys/kernel/random/boot_id").stdout.strip()
        # detach, so the exec returns before sshd goes away
        # if it goes down sooner than asked, wait_reboot still sees the new boot id
        with contextlib.suppress(ConnectionLost):
            self.transport.run("systemd-run --on-active=1 --timer-property=AccuracySec=100ms "
                               "systemctl reboot >/dev/null 2>&1 || (sleep 1; systemctl reboot) "
                               ">/dev/null 2>&1 &")
        new = self.transport.wait_reboot(boot, self.reboot_timeout)
        took = time.monotonic() - started
        self.log(f"back after {took:.1f}s (boot id {new})")
        self.listener(self.host, "back", f"{took:.0f}")
        result.results.append(OpResult(self.host, op, "changed", took, started=started))

    def apply(self, work: Sequence[RoleWork]) -> HostResult:
        started = time.monotonic()
        result = HostResult(self.host, started=started)
        try:
            for role in work:
                changed = self.run_ops(role.ops, result)
                notified = {name for op in changed for name in op.notify}
                for name, handler in role.handlers.items():
                    if name not in notified:
                        continue
                    if handler.reboot:
                        self.reboot(handler, result)
                    else:
                        self.run_ops([handler], result)
        except (CommandFailed, ConnectError) as exc:
            result.error = exc
            self.listener(self.host, "fail", str(exc))
            self.log(f"FAILED: {exc}")
        result.elapsed = time.monotonic() - started
        self.listener(self.host, "done", "")
        return result


def run_phase(work: Mapping[str, Sequence[RoleWork]], runners: Mapping[str, HostRunner],
              ) -> dict[str, HostResult]:
    """Apply every host's work in parallel (one thread per host) and wait for all: a barrier."""
    busy = [h for h in work if any(rw.ops for rw in work[h])]
    done = in_parallel(busy, lambda h: runners[h].apply(work[h]))
    results = {h: HostResult(h, error=Gpuk8sError(f"{h}: internal error: {r!r}"))
               if isinstance(r, Exception) else r for h, r in done.items()}
    for host in work:
        results.setdefault(host, HostResult(host))
    return results
