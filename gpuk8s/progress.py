"""What a run shows while it works. On a terminal: a live panel, one bar for the phase (hosts
done of those it changes), then one line per host with a spinner while its command runs, its
phase, the op it is on and how long that has taken. Elsewhere (CI logs, pipes): plain lines,
one per op as it starts and one per reboot once the host is back.

Text reaching this module is already redacted and made safe by the Reporter (report.py); it
is shown only as ``Text`` or with ``markup=False``."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

#: the status shown for each state, and its colour
_STATES = {"waiting": ("·", "dim"), "running": ("", "yellow"), "rebooting": ("↻", "magenta"),
           "done": ("✓", "green"), "failed": ("✗", "red")}


@dataclass
class _Host:
    state: str = "waiting"
    op: str = ""
    #: when the current op (or reboot) started, and when the host's work in the phase did
    since: float = field(default_factory=time.monotonic)
    began: float = field(default_factory=time.monotonic)
    ended: float | None = None
    spinner: Spinner = field(default_factory=lambda: Spinner("dots", style="yellow"))


class Progress:
    """The live panel (``live=True``) or plain lines, fed by the executor's events."""

    def __init__(self, console: Console, *, live: bool, quiet: bool = False) -> None:
        self.console = console
        self.live_wanted = live and not quiet
        self.quiet = quiet
        self.phase = ""
        self.total = 0
        self.phase_began = time.monotonic()
        self.hosts: dict[str, _Host] = {}
        self._live: Live | None = None
        self._lock = threading.RLock()

    # -- the run's shape ---------------------------------------------------------------------
    def begin_phase(self, name: str, hosts: Sequence[str]) -> None:
        """A phase starts changing ``hosts`` (its bar counts them)."""
        with self._lock:
            self.phase, self.total = name, len(hosts)
            self.phase_began = time.monotonic()
            self.hosts = {h: _Host() for h in hosts}

    def start(self, hosts: Sequence[str]) -> None:
        """A batch of the phase starts (every host at once, or ``serial`` at a time)."""
        live = None
        with self._lock:
            for h in hosts:
                self.hosts.setdefault(h, _Host())
                self.hosts[h].began = self.hosts[h].since = time.monotonic()
            if self.live_wanted and hosts and self._live is None:
                live = self._live = Live(self, console=self.console, refresh_per_second=10,
                                         transient=True)
        if live is not None:
            live.start()  # outside our lock, like stop(): it takes the console's

    def stop(self) -> None:
        """The batch is over: the panel goes, and a line per phase says how it went.
        (Never print or stop the panel holding the lock: the panel's refresh thread renders
        under the console's lock and then takes ours.)"""
        with self._lock:
            live, self._live = self._live, None
            done = [h for h, s in self.hosts.items() if s.state in ("done", "failed")]
            failed = sum(s.state == "failed" for s in self.hosts.values())
            line = "" if not self.phase or len(done) != self.total or self.quiet else (
                f"  {self.phase}: {self.total - failed}/{self.total} host(s) done"
                + (f", {failed} failed" if failed else "")
                + f" in {time.monotonic() - self.phase_began:.1f}s")
        if live is not None:
            live.stop()
        if line:
            self.console.print(line, markup=False, highlight=False,
                               style="red" if failed else "dim")

    # -- events (executor.Listener) --------------------------------------------------------
    def event(self, host: str, kind: str, text: str) -> None:
        """``text`` is already safe (redacted, control characters escaped)."""
        first = (text.splitlines() or [""])[0]
        say: tuple[str, str, bool] | None = None  # (label, text, shown above a live panel)
        with self._lock:
            if host not in self.hosts and kind == "done":
                return  # a host of the phase with nothing to change: not on the bar
            line = self.hosts.setdefault(host, _Host())
            now = time.monotonic()
            if kind in ("op", "handler"):
                line.state, line.op, line.since = "running", first, now
                say = ("->" if kind == "op" else "=>", first, False)
            elif kind == "reboot":  # said once it is back: one calm line per reboot
                line.state, line.op, line.since = "rebooting", first, now
            elif kind == "back":
                line.state, line.op, line.since = "running", f"back after {first} s", now
                say = (f"rebooting ... back after {first} s", "", True)
            elif kind == "fail":
                line.state, line.op = "failed", first
                say = ("FAILED", first, True)
            elif kind == "done" and line.state != "failed":
                line.state, line.op, line.since = "done", "", now
            if kind in ("done", "fail"):
                line.ended = now
            live = self._live
        if live is not None:
            live.refresh()  # every state is drawn, however short (outside our lock)
        if say is None:
            return
        label, shown, calm = say
        # a live panel shows ops itself; reboots and failures also get a line above it;
        # --quiet keeps only failures
        if (live is not None and not calm) or (self.quiet and label != "FAILED"):
            return
        self.console.print(f"  [{host}] {label}" + (f" {shown}" if shown else ""),
                           markup=False, highlight=False,
                           style="red" if label == "FAILED" else None)

    # -- the panel ---------------------------------------------------------------------------
    def __rich__(self) -> RenderableType:
        with self._lock:
            now = time.monotonic()
            done = sum(s.state in ("done", "failed") for s in self.hosts.values())
            bar = Table.grid(padding=(0, 1))
            bar.add_row(Text(self.phase or "run", style="bold"),
                        ProgressBar(total=max(self.total, 1), completed=done, width=30),
                        Text(f"{done}/{self.total} hosts"),
                        Text(f"{now - self.phase_began:5.1f}s", style="dim"))
            rows = Table.grid(padding=(0, 1))
            for host, s in self.hosts.items():
                mark, style = _STATES[s.state]
                icon: RenderableType = s.spinner if s.state == "running" else \
                    Text(mark, style=style)
                took = "" if s.state in ("waiting", "done") else f"{now - s.since:5.1f}s"
                rows.add_row(icon, Text(host, style="bold"), Text(s.state, style=style),
                             Text(s.op), Text(took, style="dim"),
                             Text(f"(host {(s.ended or now) - s.began:5.1f}s)", style="dim"))
            return Group(bar, rows)
