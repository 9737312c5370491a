"""A finished run as one self-contained HTML page (``invoke report``): runs/<run>/report.html.

The page has a per-host timeline (phases and ops as bars placed by time), what changed, the
failures with the tail of each failed host's log, and the cluster's nodes. It carries its own
CSS, no script and no external URL (its Content-Security-Policy forbids both), so it can be
attached to a ticket as it is.

Everything read from report.json and the logs is untrusted (node output, inventory values): it
reaches the page only through :func:`esc` (text and attribute values alike), host names become
element ids only through :func:`host_id`, statuses become classes only from :data:`COLOURS`,
and numbers are placed only through :func:`_num`."""

from __future__ import annotations

import errno
import html
import json
import math
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuk8s.errors import RunFolderError
from gpuk8s.redact import Redactor
from gpuk8s.report import untrusted

#: bar colour per op status (executor.OpResult.status, and "planned" for a check run); the
#: browser test looks for these colours' pixels inside each host's row
COLOURS = {"ok": "#3b9a57", "changed": "#2f6fd3", "warning": "#e0901b", "failed": "#d1342f",
           "planned": "#8a63c9"}
OTHER = "#7d7d7d"
#: a phase bar's colour: its worst op status, in this order
SEVERITY = ("failed", "warning", "changed", "planned", "ok")
LOG_TAIL = 40
#: a run folder's name: runs/<YYYYmmdd-HHMMSS>-<command>[-n]
RUN_NAME = re.compile(r"^\d{8}-\d{6}-")
#: report.json keys shown in their own section; the others go under "other fields"
SHOWN = {"command", "started", "elapsed", "wall_time", "phases", "steps", "cluster",
         "failed_hosts", "error", "accept"}

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:20px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 8px}h2{font-size:17px;margin:24px 0 8px}h3{font-size:14px;margin:0}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
.meta td:first-child{font-weight:600}.muted{color:#777}
.legend span{display:inline-block;margin-right:12px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}
.timeline{width:100%}.axis,.track{position:relative;margin-left:70px}
.axis{height:16px;font-size:11px;color:#777;border-bottom:1px solid #bbb}
.axis span{position:absolute;top:0;white-space:nowrap}
.host{padding:6px 0;border-bottom:1px solid #eee}
.host h3 small{font-weight:400;color:#777;margin-left:8px}
.lane{position:relative;height:18px;margin-top:3px}
.lane-label{position:absolute;left:0;width:66px;font-size:11px;font-weight:400;color:#777}
.track{height:18px;background:#f4f4f4;overflow:hidden}
.bar{position:absolute;top:2px;bottom:2px;min-width:4px;overflow:hidden;white-space:nowrap;
color:#fff;font-size:11px;line-height:14px;box-sizing:border-box;padding:0 2px}
.phase{top:0;bottom:0;line-height:18px;border-right:1px solid #fff}
pre{background:#f6f6f6;border:1px solid #ddd;padding:8px;overflow-x:auto;font-size:12px;
white-space:pre-wrap;word-break:break-all}
.failed-host{border-left:4px solid #d1342f;padding-left:10px;margin-bottom:16px}
""" + "".join(f".s-{name}{{background:{colour}}}" for name, colour in COLOURS.items()) + \
    f".s-other{{background:{OTHER}}}"


def esc(value: object) -> str:
    """The page's one sink for untrusted text: control characters made visible
    (report.untrusted), then HTML-escaped for element text and quoted attribute values."""
    return html.escape(untrusted(value), quote=True)


def host_id(host: object, taken: set[str]) -> str:
    """A stable element id for a host: ``host-`` and its name with anything outside
    [A-Za-z0-9_-] replaced by ``_``; ``-2``, ``-3``... where two names give the same id."""
    base = "host-" + re.sub(r"[^A-Za-z0-9_-]", "_", str(host))[:100]
    ident, n = base, 1
    while ident in taken:
        n += 1
        ident = f"{base}-{n}"
    taken.add(ident)
    return ident


def _num(value: object, default: float = 0.0) -> float:
    """A finite, non-negative number from report.json, else ``default``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    number = float(value)
    return number if math.isfinite(number) and number >= 0 else default


def _dicts(value: object) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _items(value: object) -> list[tuple[str, dict[str, Any]]]:
    if not isinstance(value, dict):
        return []
    return [(str(k), v) for k, v in value.items() if isinstance(v, dict)]


def _status(value: object) -> str:
    return value if isinstance(value, str) and value in COLOURS else "other"


def _worst(statuses: Iterable[str]) -> str:
    seen = set(statuses)
    return next((s for s in SEVERITY if s in seen), "ok")


@dataclass
class Bar:
    lane: str  # "phase" or "op"
    start: float
    elapsed: float
    status: str
    label: str
    title: str


@dataclass
class Item:  # one op or step, for the "What changed" and failure lists
    host: str
    where: str  # phase name, or "step"
    op: dict[str, Any]


def _tooltip(op_id: object, reason: object, status: str, elapsed: float) -> str:
    return f"{op_id}\n{reason}\n{status}, {elapsed:.3f}s"


def timeline(report: dict[str, Any]) -> tuple[dict[str, list[Bar]], list[Item], float]:
    """Every host's bars, every op and step (with where it ran), and the time scale.

    Bars are placed by the ``started`` offsets (seconds since the run started) where the
    report has them; without them (older reports) phases follow one another, a host's ops
    one another within its phase, and steps one another after the phases."""
    bars: dict[str, list[Bar]] = {}
    items: list[Item] = []
    cursor = 0.0
    for phase in _dicts(report.get("phases")):
        name = str(phase.get("phase", "?"))
        p_start = _num(phase.get("started"), cursor)
        p_end = p_start + _num(phase.get("elapsed"))
        for host, res in _items(phase.get("hosts")):
            h_start = _num(res.get("started"), p_start)
            t, statuses, ops = h_start, [], _dicts(res.get("ops"))
            # laid out one after another, ops stay inside the host's phase time (older
            # reports gave every op of a role script the whole script's time)
            total = sum(_num(op.get("elapsed")) for op in ops)
            squeeze = min(1.0, _num(res.get("elapsed"), total) / total) if total else 1.0
            for op in ops:
                elapsed = width = _num(op.get("elapsed"))
                start = _num(op.get("started"), -1.0)
                if start < 0:
                    start, width = t, elapsed * squeeze
                status = _status(op.get("status"))
                statuses.append(status)
                bars.setdefault(host, []).append(Bar("op", start, width, status, "", _tooltip(
                    op.get("id"), op.get("reason", ""), str(op.get("status")), elapsed)))
                items.append(Item(host, name, op))
                t = start + width
            if res.get("error"):
                statuses.append("failed")
            h_elapsed = _num(res.get("elapsed"), t - h_start)
            status = _worst(statuses)
            bars.setdefault(host, []).append(Bar(
                "phase", h_start, h_elapsed, status, name,
                f"phase {name}\n{len(ops)} op(s), {status}, {h_elapsed:.3f}s"))
            p_end = max(p_end, h_start + h_elapsed, t)
        cursor = p_end
    for step in _dicts(report.get("steps")):
        host = str(step.get("host", "?"))
        start, elapsed = _num(step.get("started"), cursor), _num(step.get("elapsed"))
        bars.setdefault(host, []).append(Bar("op", start, elapsed, _status(step.get(
            "status")), "", _tooltip(step.get("id"), step.get("reason", ""),
                                     str(step.get("status")), elapsed)))
        items.append(Item(host, "step", step))
        if "started" not in step:
            cursor = start + elapsed
    ends = [b.start + b.elapsed for host_bars in bars.values() for b in host_bars]
    scale = max([_num(report.get("elapsed")), *ends, 0.001])
    return bars, items, scale


def _bar(bar: Bar, scale: float) -> str:
    left = min(bar.start / scale * 100, 99.6)
    width = min(bar.elapsed / scale * 100, 100 - left)
    kind = "phase" if bar.lane == "phase" else "op"
    return (f'<div class="bar {kind} s-{bar.status}" style="left:{left:.3f}%;width:{width:.3f}%"'
            f' title="{esc(bar.title)}">{esc(bar.label)}</div>')


def _host_section(host: str, ident: str, host_bars: list[Bar], items: list[Item],
                  scale: float) -> str:
    counts: dict[str, int] = {}
    for item in items:
        if item.host == host:
            status = str(item.op.get("status"))
            counts[status] = counts.get(status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no ops"
    lanes = []
    for lane, label in (("phase", "phases"), ("op", "ops")):
        inner = "".join(_bar(b, scale) for b in host_bars if b.lane == lane)
        lanes.append(f'<div class="lane"><span class="lane-label">{label}</span>'
                     f'<div class="track">{inner}</div></div>')
    return (f'<section class="host" id="{esc(ident)}"><h3>{esc(host)}<small>{esc(summary)}'
            f'</small></h3>{"".join(lanes)}</section>')


def _axis(scale: float) -> str:
    ticks = "".join(f'<span style="left:{min(f * 100, 94):.1f}%">{scale * f:.1f}s</span>'
                    for f in (0, 0.25, 0.5, 0.75, 1))
    return f'<div class="axis">{ticks}</div>'


def _failed_hosts(report: dict[str, Any], items: list[Item]) -> dict[str, list[str]]:
    """host -> the causes recorded for it (failed_hosts, phase errors); hosts with a failed op
    or step are listed too."""
    failed: dict[str, list[str]] = {}
    for host, info in _items(report.get("failed_hosts")):
        failed.setdefault(host, []).append(f"{info.get('status', 'failed')}: "
                                           f"{info.get('cause', '')}")
    for phase in _dicts(report.get("phases")):
        for host, res in _items(phase.get("hosts")):
            error = str(res.get("error") or "")
            causes = failed.setdefault(host, []) if error else []
            if error and not any(error.splitlines()[0] in c for c in causes):
                causes.append(f"phase {phase.get('phase', '?')}: {error}")
    for item in items:
        if item.op.get("status") == "failed":
            failed.setdefault(item.host, [])
    return failed


class NotRegular(OSError):
    """A run folder entry that is not a regular file of its own (a symlink, a FIFO...)."""


def read_regular(path: Path, tail: int | None = None) -> bytes:
    """The content of ``path`` (its last ``tail`` bytes), a regular file opened without
    following a symlink (O_NOFOLLOW) and checked on the open descriptor (fstat S_ISREG): a run
    folder received from someone else cannot make the page embed what a link points at (a
    gpu-01.log -> ~/.ssh/id_ed25519), and a FIFO cannot hang it. Raises NotRegular saying what
    the entry is, or the OSError of the open."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        if exc.errno == errno.ELOOP or path.is_symlink():
            raise NotRegular(f"{path.name} is a symlink: not read") from None
        raise
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(f"{path.name} is not a regular file: not read")
        if tail is not None:
            fh.seek(max(0, st.st_size - tail))
        return fh.read()


def _log_tail(logs: dict[str, Path], host: str) -> str:
    path = logs.get(host)
    if path is None:
        return f"(no {host}.log in the run folder)"
    try:
        text = read_regular(path, tail=256 * 1024).decode("utf-8", errors="replace")
    except NotRegular as exc:
        return f"({exc})"
    except OSError as exc:
        return f"(cannot read {path.name}: {exc.strerror or exc})"
    return "\n".join(text.splitlines()[-LOG_TAIL:]) or "(empty log)"


def _op_table(items: list[Item]) -> str:
    return ("<table><tr><th>phase</th><th>op</th><th>reason</th><th>time</th></tr>" + "".join(
        f"<tr><td>{esc(i.where)}</td><td>{esc(i.op.get('id', '?'))}</td><td>"
        f"{esc(i.op.get('reason', ''))}</td><td>{_num(i.op.get('elapsed')):.3f}s</td></tr>"
        for i in items) + "</table>")


def _by_host(items: list[Item], status: str, title: str, empty: str) -> str:
    chosen = [i for i in items if i.op.get("status") == status]
    if not chosen:
        return f"<h2>{title}</h2><p class=\"muted\">{empty}</p>"
    hosts = sorted({i.host for i in chosen})
    parts = [f"<h2>{title}</h2>"]
    for host in hosts:
        mine = [i for i in chosen if i.host == host]
        parts.append(f"<h3>{esc(host)} ({len(mine)})</h3>{_op_table(mine)}")
    return f'<div class="{status}-list">{"".join(parts)}</div>'


def _failures(report: dict[str, Any], items: list[Item], failed: dict[str, list[str]],
              logs: dict[str, Path]) -> str:
    parts = ["<h2>Failures</h2>"]
    if report.get("error"):
        parts.append(f'<p>The run ended with an error:</p><pre class="error">'
                     f'{esc(report["error"])}</pre>')
    if not failed and not report.get("error"):
        parts.append('<p class="muted">No failures.</p>')
    for host in sorted(failed):
        ops = [i for i in items if i.host == host and i.op.get("status") == "failed"]
        causes = "".join(f"<pre>{esc(c)}</pre>" for c in failed[host])
        table = _op_table(ops) if ops else ""
        parts.append(f'<div class="failed-host"><h3>{esc(host)}</h3>{causes}{table}'
                     f'<p>last {LOG_TAIL} lines of {esc(host)}.log:</p>'
                     f'<pre class="log">{esc(_log_tail(logs, host))}</pre></div>')
    return "".join(parts)


def _cluster(report: dict[str, Any]) -> str:
    cluster = report.get("cluster")
    nodes = _dicts(cluster.get("nodes")) if isinstance(cluster, dict) else []
    if not nodes:
        return '<h2>Cluster</h2><p class="muted">Nodes and GPUs: not recorded.</p>'
    rows = "".join(
        f"<tr><td>{esc(n.get('name', '?'))}</td>"
        f"<td>{'Ready' if n.get('ready') is True else 'NotReady'}</td>"
        f"<td>{esc(', '.join(map(str, n['roles'])) if isinstance(n.get('roles'), list) else '')}"
        f"</td><td>{esc(n.get('version', ''))}</td><td>{esc(n.get('gpus', 0))}</td></tr>"
        for n in nodes)
    return ('<h2>Cluster</h2><table class="cluster"><tr><th>node</th><th>ready</th>'
            f'<th>roles</th><th>version</th><th>GPUs</th></tr>{rows}</table>')


def _figure(c: dict[str, Any]) -> str:
    if "value" not in c:
        return ""
    return f"{esc(c['value'])} {esc(c.get('unit', ''))}"


def _accept(report: dict[str, Any]) -> str:
    """`invoke accept`'s verdicts: per node, every check with its figure, the reference it was
    held to and that reference's source."""
    results = _items(report.get("accept"))
    if not results:
        return ""
    parts = ["<h2>GPU acceptance</h2>"]
    for host, r in results:
        rows = []
        for where, checks in [("node", _dicts(r.get("node_checks")))] + [
                (f"GPU {g.get('index', '?')}", _dicts(g.get("checks")))
                for g in _dicts(r.get("gpus"))]:
            rows += [f"<tr><td>{esc(where)}</td><td>{esc(c.get('check', ''))}</td>"
                     f"<td class=\"s-{esc(c.get('verdict', ''))}\">{esc(c.get('verdict', ''))}"
                     f"</td><td>{_figure(c)}</td><td>{esc(c.get('reference', ''))}</td>"
                     f"<td>{esc(c.get('source', ''))}</td><td>{esc(c.get('detail', ''))}</td>"
                     "</tr>" for c in checks]
        reasons = ", ".join(map(str, r.get("reasons") or []))
        parts.append(
            f"<h3>{esc(host)}: {esc(r.get('verdict', '?'))}"
            f"{' (' + esc(reasons) + ')' if reasons else ''}</h3>"
            f"<p>{esc(r.get('action', ''))}</p><table class=\"cluster\"><tr><th>where</th>"
            "<th>check</th><th>verdict</th><th>figure</th><th>reference</th><th>source</th>"
            f"<th>detail</th></tr>{''.join(rows)}</table>")
    return "".join(parts)


def load(run_dir: Path) -> dict[str, Any]:
    """report.json of a run folder, or a RunFolderError that says what is wrong and the fix."""
    if not run_dir.is_dir():
        raise RunFolderError(f"{run_dir}: no such run folder",
                             fix="pass a folder under runs/, e.g. --run runs/<time>-bootstrap")
    path = run_dir / "report.json"
    try:
        text = read_regular(path).decode("utf-8", errors="replace")
    except NotRegular as exc:
        raise RunFolderError(f"{run_dir}: {exc}",
                             fix="pass a run folder written by gpuk8s (its report.json is a "
                                 "file of its own)") from None
    except FileNotFoundError:
        raise RunFolderError(f"{run_dir} has no report.json: the run was killed before it "
                             "finished, or is still running",
                             fix="wait for the run to end, or pass another run folder "
                                 "(--run runs/<time>-<command>)") from None
    except OSError as exc:
        raise RunFolderError(f"{path}: cannot read it ({exc.strerror or exc})",
                             fix="check the file's permissions (run as its owner)") from None
    try:
        report = json.loads(text)
    except ValueError as exc:
        raise RunFolderError(f"{path}: not valid JSON ({exc})",
                             fix="the file was cut short or edited: run the command again, "
                                 "or pass another run folder") from None
    if not isinstance(report, dict):
        raise RunFolderError(f"{path}: not a gpuk8s report (a JSON object is expected)",
                             fix="pass a run folder written by gpuk8s")
    return report


def render(run_dir: Path) -> str:
    """The run folder's report.json (and the failed hosts' logs) as one HTML page."""
    run_dir = Path(run_dir)
    report = load(run_dir)
    # every <host>.log directly in the folder (a symlink too: _log_tail names it, unread)
    logs = {p.name[:-4]: p for p in run_dir.glob("*.log") if not p.is_dir()}
    bars, items, scale = timeline(report)
    failed = _failed_hosts(report, items)
    taken: set[str] = set()
    hosts = sorted(set(bars) | set(failed))
    sections = "".join(_host_section(h, host_id(h, taken), bars.get(h, []), items, scale)
                       for h in hosts) or '<p class="muted">No phases or steps recorded.</p>'
    legend = "".join(f'<span><i class="s-{s}"></i>{s}</span>' for s in COLOURS)
    command = report.get("command", "?")
    meta = [("command", esc(command)), ("run folder", esc(run_dir.name)),
            ("started", esc(report.get("started", "?"))),
            ("wall time", f"{_num(report.get('elapsed')):.2f}s"),
            ("failed hosts", esc(", ".join(sorted(failed)) or "none"))]
    other = {k: v for k, v in report.items() if k not in SHOWN}
    extra = (f"<details><summary>other fields of report.json ({esc(', '.join(other))})"
             f"</summary><pre>{esc(Redactor()(json.dumps(other, indent=2, default=str)))}"
             "</pre></details>"
             if other else "")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        'style-src \'unsafe-inline\'; img-src data:">'
        f"<title>gpuk8s {esc(command)} {esc(run_dir.name)}</title><style>{CSS}</style>"
        f"</head><body><h1>gpuk8s {esc(command)}</h1><table class=\"meta\">"
        + "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in meta)
        + f'</table><h2>Timeline</h2><p class="legend">{legend}</p>'
        f'<div class="timeline">{_axis(scale)}{sections}</div>'
        + _by_host(items, "changed", "What changed", "Nothing changed.")
        + (_by_host(items, "planned", "Planned (a check run: not applied)", "")
           if any(i.op.get("status") == "planned" for i in items) else "")
        + (_by_host(items, "warning", "Warnings", "")
           if any(i.op.get("status") == "warning" for i in items) else "")
        + _failures(report, items, failed, logs) + _accept(report) + _cluster(report) + extra
        + "</body></html>\n")


def write(run_dir: Path) -> Path:
    """Render and write ``run_dir/report.html`` (0600, like the run's other files)."""
    run_dir = Path(run_dir)
    page = render(run_dir)
    path = run_dir / "report.html"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(page)
    return path


def latest_run(base: Path | None = None) -> Path:
    """The newest run folder under ``base`` (by its time-stamped name, then mtime); entries
    that are not run folders (bench-*, files) are ignored."""
    # where run folders go: the same setting as session.py's (GPUK8S_RUNS_DIR, else runs/)
    base = Path(os.environ.get("GPUK8S_RUNS_DIR", "runs")) if base is None else base
    try:
        found = [p for p in base.iterdir() if RUN_NAME.match(p.name) and p.is_dir()]
    except OSError:
        found = []
    if not found:
        raise RunFolderError(f"no run folder under {base}/",
                             fix="run a command first (e.g. invoke bootstrap), or pass "
                                 "--run RUN_DIR")
    return max(found, key=lambda p: (p.name[:15], p.stat().st_mtime, p.name))


def report(run: str | Path | None = None) -> Path:
    """``invoke report``: write the run's report.html (default: the latest run folder) and
    print its path. Creates no run folder of its own."""
    path = write(Path(run) if run else latest_run())
    print(untrusted(path))
    return path
