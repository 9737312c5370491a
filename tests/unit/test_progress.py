"""The live progress pieces without a lab: op start markers found in streamed chunks however
the stream is cut, each op's time from the node's clock (and kept sane when the node prints
junk), and the panel / plain lines the Reporter shows."""

from __future__ import annotations

import io
import random
import re
import subprocess

from rich.console import Console

from gpuk8s.executor import _OpStarts, build_script
from gpuk8s.ops import change
from gpuk8s.progress import Progress
from gpuk8s.report import Reporter
from gpuk8s.sections import section_times

OPS = [change(f"role | op {i}", f"+ op {i}", f"sleep 0.{i}") for i in range(1, 4)]


def test_marker_times_come_from_the_real_script() -> None:
    """build_script's markers, run by the real sh: every op has a start and an end on the
    node's clock, in order, and the sleeps show in the differences."""
    script = build_script(OPS, "@@M")
    out = subprocess.run(["/bin/sh", "-s"], input=script, capture_output=True, text=True,
                         timeout=30).stdout
    times = section_times(out, "@@M")
    assert sorted(times) == [0, 1, 2]
    for i, (begin, end) in times.items():
        assert end is not None and 0.1 * (i + 1) - 0.05 <= end - begin < 0.1 * (i + 1) + 0.5
    assert times[0][1] <= times[1][0] <= times[2][0]  # type: ignore[operator]


def test_junk_marker_lines_leave_the_time_unknown() -> None:
    out = "\n".join(["@@M ", "@@M B", "@@M B x 1.0", "@@M B 0 nan", "@@M B 1 5.0",
                     "@@M E 1 0 inf", "@@M B 2 7.0", "@@M E 2 0 7.5", "@@M E 9 0 1.0"])
    assert section_times(out, "@@M") == {1: (5.0, None), 2: (7.0, 7.5)}


def test_op_starts_are_found_however_the_stream_is_cut() -> None:
    text = "".join(f"noise {i}\n@@GPUK8S-OP-abc B {i} 1764000000.{i}\nout\n"
                   f"@@GPUK8S-OP-abc E {i} 0 1764000001.0\n" for i in range(3)).encode()
    rng = random.Random(7)
    for _ in range(300):
        seen: list[str] = []
        feed = _OpStarts("h", OPS, "@@GPUK8S-OP-abc",
                         lambda host, kind, op, seen=seen: seen.append(op))
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, 12)))
        for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
            feed(text[a:b])
        assert seen == [op.id for op in OPS]
    seen = []
    feed = _OpStarts("h", OPS, "@@GPUK8S-OP-abc", lambda host, kind, op: seen.append(op))
    feed(b"@@GPUK8S-OP-abc B 7 1.0\n@@GPUK8S-OP-abc B 01x 1.0\n")  # no such op: ignored
    assert seen == []


def _plain() -> tuple[Reporter, io.StringIO]:
    buf = io.StringIO()
    return Reporter(buf), buf


def test_plain_lines_per_op_reboot_and_phase() -> None:
    rep, buf = _plain()
    rep.begin_phase("node", ["gpu-01", "cpu-01"])
    rep.start(["gpu-01", "cpu-01"])
    rep.event("gpu-01", "op", "nvidia_driver | driver packages")
    rep.event("gpu-01", "reboot", "nvidia_driver | reboot")
    rep.event("gpu-01", "back", "41")
    rep.event("cpu-01", "op", "base | packages")
    rep.event("cp-01", "done", "")  # a host with nothing to change: not counted
    rep.event("gpu-01", "done", "")
    rep.event("cpu-01", "done", "")
    rep.stop()
    lines = buf.getvalue().splitlines()
    assert lines[:3] == ["  [gpu-01] -> nvidia_driver | driver packages",
                         "  [gpu-01] rebooting ... back after 41 s",
                         "  [cpu-01] -> base | packages"]
    assert re.fullmatch(r"  node: 2/2 host\(s\) done in \d+\.\ds", lines[3])


def test_quiet_keeps_only_failures() -> None:
    buf = io.StringIO()
    rep = Reporter(buf, quiet=True)
    rep.begin_phase("node", ["a", "b"])
    rep.start(["a", "b"])
    rep.event("a", "op", "x | y")
    rep.event("b", "fail", "b: [x | y] exited 1")
    rep.event("a", "done", "")
    rep.stop()
    assert buf.getvalue() == "  [b] FAILED b: [x | y] exited 1\n"


def test_the_panel_shows_the_bar_a_spinner_and_each_hosts_op() -> None:
    console = Console(file=io.StringIO(), width=120, color_system=None)
    progress = Progress(console, live=False)
    progress.begin_phase("node", ["gpu-01", "gpu-02", "cpu-01"])
    progress.start(["gpu-01", "gpu-02", "cpu-01"])
    progress.event("gpu-01", "op", "kubernetes | packages")
    progress.event("gpu-02", "reboot", "nvidia_driver | reboot")
    progress.event("cpu-01", "done", "")
    console.print(progress)
    shown = console.file.getvalue()  # type: ignore[attr-defined]
    assert re.search(r"node +━+ +1/3 hosts", shown), shown
    assert re.search(r"[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏] gpu-01 running +kubernetes \| packages", shown), shown
    assert re.search(r"↻ gpu-02 rebooting +nvidia_driver \| reboot", shown), shown
    assert re.search(r"✓ cpu-01 done", shown), shown
