"""What a run shows and keeps: the plan, live per-host progress, the run folder (per-host logs
and a JSON report) and the final table. Everything passes through the redactor first.

Text from nodes and inventories is untrusted: it goes through :func:`untrusted` (control
characters shown escaped) and reaches Rich only as plain text (:func:`untrusted_text`, a
``Text``, or ``markup=False``), never as markup; only gpuk8s's own literals carry markup."""

from __future__ import annotations

import json
import logging
import os
import re
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TextIO

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpuk8s.executor import HostResult
from gpuk8s.ops import Op
from gpuk8s.progress import Progress
from gpuk8s.redact import Redactor

#: C0 and C1 control characters (and DEL) except \n and \t; Unicode line/paragraph separators
#: and bidirectional overrides/isolates, which reorder or split what the terminal shows
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def untrusted(text: object) -> str:
    """``text`` (from a node or an inventory) made safe to print or log: every C0/C1 control
    character except newline and tab (and DEL, the Unicode line/paragraph separators and
    bidi overrides) is shown as a visible Python-style escape, ``\\x1b`` (the four characters
    backslash, x, 1, b) or ``\\u202e``; a CRLF line end becomes a plain newline. The result
    is still plain text: give it to Rich as a ``Text`` (:func:`untrusted_text`) or with
    ``markup=False``, never inside a markup string. Backslashes are left as they are, so a
    node that prints the four characters ``\\x1b`` looks the same as one that prints ESC."""
    return _UNSAFE.sub(_escaped, str(text).replace("\r\n", "\n"))


def untrusted_text(text: object, style: str = "") -> Text:
    """:func:`untrusted` as a Rich ``Text`` (never parsed as markup or emoji codes): for table
    cells, titles, and lines that mix gpuk8s's own styling with node text."""
    return Text(untrusted(text), style=style)


@dataclass(frozen=True)
class Column:
    """One column of :meth:`Reporter.table`: its header, whether only ``-o wide`` shows it
    (kubectl's wide output), and how its cells line up."""

    header: str
    wide: bool = False
    justify: Literal["left", "right"] = "left"


#: a table cell: a ``str`` is node or inventory text (redacted, escaped, never markup); a
#: ``Text`` is one the caller built with :meth:`Reporter.cell` (to style it); numbers print
Cell = str | int | float | Text | None

#: the space between two columns of the plain table (kubectl's tabwriter pads with 3; 2 keeps
#: the status view of 20-character host names within 80 columns)
GAP = "  "


def table_lines(columns: Sequence[Column], rows: Sequence[Sequence[Text]]) -> list[Text]:
    """The plain, aligned table (no box drawing): a header of upper-case column names, then
    one line per row (and one per further line of a cell that holds several). Every cell is
    shown whole: a column is as wide as its widest line, however wide that makes the table."""
    head = [Text(c.header.upper(), style="bold") for c in columns]
    # each cell, line by line
    cells: list[list[list[Text]]] = [[list(cell.split()) for cell in row] for row in rows]
    widths = [max([cell_len(head[i].plain)] + [line.cell_len for row in cells
                                               for line in row[i]])
              for i in range(len(columns))]
    out: list[Text] = []
    header: list[list[Text]] = [[h] for h in head]
    for lines_of in [header, *cells]:
        for n in range(max(len(c) for c in lines_of)):
            line = Text()
            parts = [c[n] if n < len(c) else Text() for c in lines_of]
            last = max((i for i, p in enumerate(parts) if p.plain), default=0)
            for i, part in enumerate(parts[:last + 1]):
                pad = " " * (widths[i] - part.cell_len)
                right = columns[i].justify == "right"
                line.append_text(Text.assemble(pad if right else "", part,
                                               "" if right or i == last else pad))
                if i < last:
                    line.append(GAP)
            out.append(line)
    return out


def peak_rss_kb() -> int:
    """This process's peak resident memory in KiB. Linux's VmHWM is of the current program
    only; getrusage's ru_maxrss also keeps the pre-exec high-water mark of whatever forked us
    (a benchmark or test runner), so it is only the fallback."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


class RunLog:
    """runs/<timestamp>-<command>/: <host>.log per host and report.json."""

    def __init__(self, base: Path, command: str, redact: Redactor) -> None:
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        self.path = base / f"{stamp}-{command}"
        n = 1
        while self.path.exists():
            n += 1
            self.path = base / f"{stamp}-{command}-{n}"
        self.path.mkdir(parents=True, mode=0o700)
        self.redact = redact
        self.command = command
        self.started = time.time()
        #: time.monotonic() at the start: report.json's "started" offsets count from here
        self.t0 = time.monotonic()
        #: each host's fact probes: [{"started": s, "elapsed": s, "node_ms": {fact: ms}}]
        #: (report.json "facts"; node_ms: each fact's time on the node, see probe_times)
        self.probes: dict[str, list[dict[str, Any]]] = {}
        self._library_log = _LibraryLog(self.path / "library.log", redact)
        self.phases: list[dict[str, Any]] = []
        #: ops run outside the playbook's phases (day-2 steps, workload applies, hand-offs)
        self.steps: list[dict[str, Any]] = []
        #: what the command adds to every report.json it writes (upgrade: the target release)
        self.extra: dict[str, Any] = {}
        #: SSH connections and exec channels per host, per step of the run (see mark())
        self.round_trips: list[dict[str, Any]] = []
        self._counters: Callable[[], Mapping[str, Any]] | None = None
        self._seen: dict[str, tuple[int, int]] = {}
        self._marked = time.monotonic()
        self._lock = threading.Lock()

    def watch(self, counters: Callable[[], Mapping[str, Any]]) -> None:
        """Follow the transports' counters (``{host: Counters}``) from now on."""
        self._counters = counters

    def mark(self, step: str) -> None:
        """Record, per host, the connections and execs made since the previous mark."""
        if self._counters is None:
            return
        hosts: dict[str, dict[str, int]] = {}
        for host, c in self._counters().items():
            was = self._seen.get(host, (0, 0))
            hosts[host] = {"connects": c.connects - was[0], "execs": c.execs - was[1]}
            self._seen[host] = (c.connects, c.execs)
        now = time.monotonic()
        self.round_trips.append({"step": step, "elapsed": round(now - self._marked, 3),
                                 "hosts": hosts})
        self._marked = now

    def offset(self, monotonic: float) -> float:
        """Seconds from the start of the run to ``monotonic`` (a time.monotonic() value)."""
        return round(max(0.0, monotonic - self.t0), 3)

    def add_probe(self, host: str, started: float, elapsed: float,
                  node: Mapping[str, float] | None = None) -> None:
        """One fact probe of ``host`` (started: time.monotonic()); ``node``: seconds each
        fact took on the node, by fact key, kept as milliseconds, slowest first."""
        entry: dict[str, Any] = {"started": self.offset(started), "elapsed": round(elapsed, 3)}
        if node:
            entry["node_ms"] = {k: round(s * 1000, 1) for k, s in
                                sorted(node.items(), key=lambda kv: -kv[1])}
        with self._lock:
            self.probes.setdefault(host, []).append(entry)

    def close(self) -> None:
        """Stop copying library logging (paramiko) into this run's library.log."""
        self._library_log.close()

    def host_logger(self, host: str) -> Any:
        path = self.path / f"{host}.log"

        def write(text: str) -> None:
            line = untrusted(self.redact(text))
            with self._lock, open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
                                  "a", encoding="utf-8") as fh:
                fh.write(f"{datetime.now(UTC).strftime('%H:%M:%S')} {line}\n")
        return write

    def add_phase(self, name: str, results: Mapping[str, HostResult], elapsed: float,
                  planned: Mapping[str, Sequence[Op]] | None = None) -> None:
        """One phase, just finished, that took ``elapsed`` seconds (planning included). Every
        "started" is seconds from the start of the run: the phase's, each host's (when it
        ran something) and each op's that ran (ops that were already satisfied took no time
        and carry the host's)."""
        began = time.monotonic() - elapsed
        hosts: dict[str, Any] = {}
        for host, res in results.items():
            host_start = self.offset(res.started) if res.started else self.offset(began)
            hosts[host] = {
                "started": host_start,
                "elapsed": round(res.elapsed, 3),
                "error": self.redact(str(res.error)) if res.error else None,
                "ops": [{"id": r.op.id, "status": r.status, "reason": self.redact(r.op.reason),
                         "started": self.offset(r.started) if r.started else host_start,
                         "elapsed": round(r.elapsed, 3)} for r in res.results],
            }
        for host, ops in (planned or {}).items():
            hosts.setdefault(host, {"started": self.offset(began), "elapsed": 0, "error": None,
                                    "ops": [{"id": op.id, "reason": self.redact(op.reason),
                                             "status": "planned" if op.changes else "ok"}
                                            for op in ops]})
        self.phases.append({"phase": name, "started": self.offset(began),
                            "elapsed": round(elapsed, 3), "hosts": hosts})
        self.mark(name)

    def add_step(self, host: str, op: Op, exit_code: int, elapsed: float) -> None:
        """One op run outside a phase, as report.json lists it: host, op, exit code, time."""
        with self._lock:
            self.steps.append({"host": host, "id": op.id, "exit": exit_code,
                               "started": self.offset(time.monotonic() - elapsed),
                               "status": "ok" if exit_code == 0 else "failed",
                               "reason": self.redact(op.reason), "elapsed": round(elapsed, 3)})

    def write_report(self, **extra: Any) -> Path:
        report = {"command": self.command, "started": datetime.fromtimestamp(
            self.started, UTC).isoformat(), "elapsed": round(time.time() - self.started, 3),
            "facts": self.probes, "phases": self.phases, "steps": self.steps,
            "round_trips": self.round_trips,
            "peak_rss_kb": peak_rss_kb(), **self.extra, **extra}
        path = self.path / "report.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(self.redact(json.dumps(report, indent=2, default=str)) + "\n")
        return path


class _LibraryLog(logging.Handler):
    """paramiko's log, redacted, in the run folder's library.log instead of the terminal
    (where a reboot's refused handshakes would print tracebacks)."""

    def __init__(self, path: Path, redact: Redactor) -> None:
        super().__init__(logging.INFO)
        self.path, self.redact = path, redact
        self.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        self.logger = logging.getLogger("paramiko")
        self.logger.addHandler(self)
        if self.logger.level == logging.NOTSET or self.logger.level > logging.INFO:
            self.logger.setLevel(logging.INFO)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = untrusted(self.redact(self.format(record)))
            with open(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "a",
                      encoding="utf-8") as fh:
                fh.write(text + "\n")
        except Exception:  # logging must never break a run
            self.handleError(record)

    def close(self) -> None:
        self.logger.removeHandler(self)
        super().close()


class Reporter:
    """Terminal output. A live per-host table on a TTY; plain lines otherwise.

    Every method here takes node- or inventory-derived text and shows it redacted and through
    :func:`untrusted`, as plain text. Code that builds its own Rich tables passes such text as
    :meth:`cell` (or :func:`untrusted_text`), never as a ``str`` cell, which Rich would parse
    as markup."""

    def __init__(self, stream: TextIO | None = None, *, redact: Redactor | None = None,
                 verbose: bool = False, quiet: bool = False) -> None:
        # emoji=False: ":name:" in a node's text stays text even where markup is off
        self.console = Console(file=stream or sys.stdout, highlight=False, soft_wrap=True,
                               emoji=False)
        self.redact = redact or Redactor()
        self.verbose = verbose
        #: --quiet: no plan listing or per-op lines while applying; problems, failures and
        #: the final table still show
        self.quiet = quiet
        self.progress = Progress(self.console, live=self.console.is_terminal, quiet=quiet)

    def safe(self, text: object) -> str:
        """``text`` redacted, then :func:`untrusted`: plain text for ``markup=False`` output."""
        return untrusted(self.redact(str(text)))

    def cell(self, text: object, style: str = "") -> Text:
        """``text`` redacted and :func:`untrusted`, as a ``Text`` (a table cell, a title)."""
        return Text(self.safe(text), style=style)

    def print(self, text: str = "", style: str | None = None) -> None:
        """One line (or several) of plain text; never markup, even in gpuk8s's own text."""
        self.console.print(self.safe(text), style=style, markup=False)

    def phase(self, title: str) -> None:
        if self.quiet:
            return
        self.console.print(Text.assemble("\n", (f"== {self.safe(title)}", "bold")))

    def plan(self, ops_by_host: Mapping[str, Sequence[Op]], *, show_all: bool,
             diff: bool) -> int:
        """Print the plan (not with --quiet, unless it is all there is: ``show_all``); return
        the number of changes."""
        total = 0
        for host, ops in ops_by_host.items():
            changes = [op for op in ops if op.changes]
            total += len(changes)
            if self.quiet and not show_all:
                continue
            shown = [op for op in ops if show_all or op.changes or op.warning]
            if not shown:
                continue
            self.console.print(Text.assemble("  ", self.cell(host, "bold"),
                                             f": {len(changes)} change(s)"))
            for op in shown:
                style = {"+": "yellow", "=": "dim", "!": "magenta"}[op.symbol]
                reason = op.reason if op.reason[:1] in "+=~-!" else f"{op.symbol} {op.reason}"
                self.console.print(Text.assemble("    ", self.cell(reason), "  ",
                                                 self.cell(f"({op.id})", "dim"), style=style))
                if diff and op.diff and not op.secret:
                    for line in self.safe(op.diff).splitlines():
                        color = "green" if line.startswith("+") else \
                            "red" if line.startswith("-") else "dim"
                        self.console.print(f"      {line}", style=color, markup=False)
        return total

    # -- live progress (executor listener) --------------------------------------------------
    def begin_phase(self, name: str, hosts: Sequence[str]) -> None:
        self.progress.begin_phase(name, [self.safe(h) for h in hosts])

    def start(self, hosts: Sequence[str]) -> None:
        self.progress.start([self.safe(h) for h in hosts])

    def stop(self) -> None:
        self.progress.stop()

    def event(self, host: str, kind: str, text: str) -> None:
        self.progress.event(self.safe(host), kind, self.safe(text))

    # -- tables ------------------------------------------------------------------------------
    def table(self, title: str | Text, columns: Sequence[Column | str],
              rows: Iterable[Sequence[Cell]], *, wide: bool = False,
              title_style: str = "") -> None:
        """Print a table the way ``kubectl get`` does: without ``wide`` the columns marked
        ``wide`` are left out (the default view, chosen to fit 80 columns with typical
        values); no cell is ever cut, folded or ellipsized. On a terminal where the whole
        table fits, a Rich table with box drawing; in a pipe, or where it would not fit
        (COLUMNS), plain aligned text (:func:`table_lines`): a long value makes its line
        longer (the terminal wraps it), never shorter cells. ``str`` cells are node or
        inventory text (:meth:`cell`), never markup."""
        cols = [c if isinstance(c, Column) else Column(c) for c in columns]
        keep = [i for i, c in enumerate(cols) if wide or not c.wide]
        shown = [cols[i] for i in keep]
        cells = [[self._cell(row[i]) for i in keep] for row in rows]
        heading = title if isinstance(title, Text) else self.cell(title)
        if title_style:
            heading.stylize(title_style)
        if self.console.is_terminal:
            table = Table(title=heading, title_justify="left")
            for c in shown:
                table.add_column(c.header, justify=c.justify)
            for row in cells:
                table.add_row(*row)
            unbounded = self.console.options.update(max_width=1 << 20)
            if self.console.measure(table, options=unbounded).maximum <= self.console.width:
                self.console.print(table)
                return
        if heading.plain:
            self.console.print(heading, soft_wrap=True)
        for line in table_lines(shown, cells):
            self.console.print(line, soft_wrap=True)

    def _cell(self, value: Cell) -> Text:
        if isinstance(value, Text):
            return value
        return self.cell("" if value is None else value)

    def problems(self, title: str, problems: Mapping[str, Sequence[tuple[str, str, str]]],
                 style: str = "red") -> None:
        """Each host's problems, one block per problem: the check and what is wrong, then the
        fix on its own line. Sentences make no table: in one, they would fill a line each
        far past 80 columns (or be folded into a column a few letters wide)."""
        for host, items in problems.items():
            if not items:
                continue
            self.console.print(self.cell(f"{title}: {host}", f"bold {style}"), soft_wrap=True)
            for name, message, fix in items:
                self.console.print(Text.assemble("  ", self.cell(name, style), ": ",
                                                 self.cell(message)), soft_wrap=True)
                if fix:
                    self.console.print(Text.assemble("    fix: ", self.cell(fix)),
                                       soft_wrap=True)

    def warnings(self, warnings: Mapping[str, Sequence[tuple[str, str, str]]]) -> None:
        for host, items in warnings.items():
            for name, message, _fix in items:
                self.console.print(Text.assemble(
                    "  ! ", self.cell(host), ": ", self.cell(message), " ",
                    self.cell(f"({name})", "dim"), style="magenta"))

    def summary(self, totals: Mapping[str, Mapping[str, Any]], elapsed: float,
                failed: Mapping[str, Mapping[str, str]] | None = None) -> None:
        """The final table; ``failed`` (host -> status, cause) marks hosts left out."""
        failed = failed or {}
        cols = [Column("host"), *(Column(c, justify="right")
                                  for c in ("changed", "ok", "failed", "time"))]
        cols += [Column("status")] if failed else []
        rows: list[list[Cell]] = []
        for host, t in totals.items():
            n = t["failed"]
            row: list[Cell] = [host, str(t["changed"]), str(t["ok"]),
                               Text(str(n), style="red") if n else "0", f"{t['time']:.1f}s"]
            if failed:
                status = failed.get(host, {}).get("status", "ok")
                row.append(self.cell(status, "red" if host in failed else ""))
            rows.append(row)
        self.table("result", cols, rows)
        for host, info in failed.items():
            cause = self.safe(info["cause"]).splitlines()
            self.console.print(f"  {self.safe(host)} {self.safe(info['status'])}: "
                               f"{cause[0] if cause else ''}",
                               style="red", markup=False, highlight=False)
        self.console.print(f"wall time {elapsed:.2f}s", markup=False)
