"""The run page in a real browser (headless Chromium from Debian; scripts/setup installs it,
and a missing one fails these tests): every host's timeline bars are drawn, the check of that
fails on a page where a host's bars are not, and untrusted text stays text."""

from __future__ import annotations

from pathlib import Path

from gpuk8s import htmlreport
from tests.browser import Rendered, render, timeline_problems
from tests.unit.test_htmlreport import EVIL_HOST, EVIL_REASON, HOSTS, four_host_report, make_run

IDS = [f"host-{h}" for h in HOSTS]


def shot(tmp_path: Path, report: dict[str, object] | None = None,
         style: str = "") -> Rendered:
    page = htmlreport.write(make_run(tmp_path, report))
    if style:
        page.write_text(page.read_text().replace("</style>", style + "</style>", 1))
    return render(page)


def test_every_host_timeline_is_drawn(tmp_path: Path) -> None:
    rendered = shot(tmp_path)
    assert timeline_problems(rendered, IDS) == {}
    boxes = [rendered.hosts[i] for i in IDS]
    assert all(b.bars >= 2 for b in boxes)  # a phase and an op bar each, at least
    assert [b.y for b in boxes] == sorted(b.y for b in boxes)  # one row per host, in order
    assert rendered.scripts == 1 and rendered.handlers == 0  # only the measuring script


def test_the_check_fails_where_a_host_has_no_bars_drawn(tmp_path: Path) -> None:
    report = four_host_report()
    for phase in report["phases"]:  # cpu-01 never ran anything: a row without bars
        phase["hosts"].pop("cpu-01", None)
    report["failed_hosts"]["cpu-01"] = {"status": "unreachable", "cause": "no route to host"}
    # gpu-02's bars are in the DOM, with boxes, but not painted: only the screenshot tells
    rendered = shot(tmp_path, report, style="#host-gpu-02 .bar{visibility:hidden}")
    problems = timeline_problems(rendered, IDS)
    assert set(problems) == {"host-cpu-01", "host-gpu-02"}, problems
    assert "no bar" in problems["host-cpu-01"] and "pixel" in problems["host-gpu-02"]


def test_untrusted_text_stays_text_in_the_browser(tmp_path: Path) -> None:
    report = four_host_report()
    hosts = report["phases"][0]["hosts"]
    hosts[EVIL_HOST] = hosts.pop("gpu-01")
    hosts[EVIL_HOST]["ops"][0]["reason"] = EVIL_REASON
    rendered = shot(tmp_path, report)
    assert rendered.scripts == 1 and rendered.handlers == 0
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered.dom
    assert timeline_problems(rendered, ["host-_script_alert_1___script_"]) == {}
