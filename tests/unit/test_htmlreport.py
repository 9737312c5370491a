"""``invoke report``: a run folder's report.json (and logs) as one self-contained HTML page."""

from __future__ import annotations

import copy
import json
import os
import re
import stat
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import cli, htmlreport
from gpuk8s.errors import RunFolderError

HOSTS = ("cp-01", "cpu-01", "gpu-01", "gpu-02")


def _op(op_id: str, status: str, elapsed: float, started: float | None,
        reason: str = "") -> dict[str, Any]:
    op = {"id": op_id, "status": status, "reason": reason or f"+ {op_id}", "elapsed": elapsed}
    if started is not None:
        op["started"] = started
    return op


def four_host_report(*, new_schema: bool = True) -> dict[str, Any]:
    """A bootstrap of cp-01, cpu-01, gpu-01, gpu-02 in which gpu-02 fails to join; with the
    ``started`` offsets (new schema) or without (older reports)."""
    def at(t: float) -> float | None:
        return t if new_schema else None

    node = {h: {"elapsed": 4.0, "error": None, "started": 1.0, "ops": [
        _op("base | packages", "ok", 0.0, at(1.0), "= curl 7.88"),
        _op("container_runtime | packages", "changed", 2.0, at(1.0), "+ install containerd.io"),
        _op("kubernetes | packages", "changed", 2.0, at(3.0), "+ install kubeadm=1.36.*"),
        _op("gpu | driver", "warning" if h.startswith("gpu") else "ok", 0.0, at(5.0),
            "! reboot pending")]} for h in HOSTS}
    join = {h: {"elapsed": 3.0, "error": None, "started": 8.0, "ops": [
        _op("join | kubeadm join", "changed", 3.0, at(8.0), "+ kubeadm join 10.88.0.11:6443")]}
        for h in ("cpu-01", "gpu-01")}
    join["gpu-02"] = {"elapsed": 1.5, "started": 8.0,
                      "error": "gpu-02: [join | kubeadm join] exited 1 (full command in the "
                               "run log)\n    error execution phase preflight: port 10250",
                      "ops": [_op("join | kubeadm join", "failed", 1.5, at(8.0),
                                  "+ kubeadm join 10.88.0.11:6443")]}
    phases = [
        {"phase": "node", "elapsed": 4.0, "started": 1.0, "hosts": node},
        {"phase": "control-plane", "elapsed": 3.0, "started": 5.0, "hosts": {
            "cp-01": {"elapsed": 3.0, "error": None, "started": 5.0, "ops": [
                _op("control_plane | kubeadm init", "changed", 3.0, at(5.0),
                    "+ kubeadm init")]}}},
        {"phase": "join", "elapsed": 3.0, "started": 8.0, "hosts": join},
        {"phase": "cluster", "elapsed": 1.0, "started": 11.0, "hosts": {
            "cp-01": {"elapsed": 1.0, "error": None, "started": 11.0, "ops": [
                _op("gpu_cluster | device plugin", "changed", 1.0, at(11.0),
                    "+ apply nvidia-device-plugin")]}}},
    ]
    steps = [{"host": "cp-01", "id": "join | token", "exit": 0, "status": "ok",
              "reason": "+ a join token valid 15m0s", "elapsed": 0.3, "started": 7.6}]
    if not new_schema:
        for p in phases:
            del p["started"]
            for h in p["hosts"].values():
                del h["started"]
        del steps[0]["started"]
    return {"command": "bootstrap", "started": "2026-11-27T05:04:16.666066+00:00",
            "elapsed": 12.5, "phases": phases, "steps": steps, "round_trips": [],
            "peak_rss_kb": 54248, "wall_time": 12.3, "check": False,
            "failed_hosts": {"gpu-02": {"status": "failed", "cause": join["gpu-02"]["error"]}},
            "cluster": {"nodes": [
                {"name": "cp-01", "ready": True, "roles": ["control-plane"],
                 "version": "v1.36.2", "gpus": 0},
                {"name": "cpu-01", "ready": True, "roles": [], "version": "v1.36.2", "gpus": 0},
                {"name": "gpu-01", "ready": True, "roles": [], "version": "v1.36.2",
                 "gpus": 2}]}}


def make_run(base: Path, report: dict[str, Any] | None = None,
             name: str = "20261127-050416-bootstrap") -> Path:
    """A run folder with report.json and a log per host (gpu-02's: 60 numbered lines)."""
    run = base / name
    run.mkdir(parents=True)
    (run / "report.json").write_text(json.dumps(report or four_host_report()))
    for host in HOSTS:
        lines = [f"05:04:{i % 60:02d} {host} line {i}" for i in range(1, 61)]
        (run / f"{host}.log").write_text("\n".join(lines) + "\n")
    return run


def sections(page: str) -> dict[str, str]:
    """host section id -> its HTML."""
    return dict(re.findall(r'<section class="host" id="([^"]+)">(.*?)</section>', page, re.S))


@pytest.mark.parametrize("new_schema", [True, False], ids=["started", "sequential"])
def test_every_host_has_a_timeline_with_bars(tmp_path: Path, new_schema: bool) -> None:
    page = htmlreport.render(make_run(tmp_path, four_host_report(new_schema=new_schema)))
    found = sections(page)
    assert sorted(found) == [f"host-{h}" for h in HOSTS]
    for host in HOSTS:
        bars = re.findall(r'<div class="bar (phase|op) s-(\w+)" style="left:([\d.]+)%;'
                          r'width:([\d.]+)%" title="[^"]*">', found[f"host-{host}"])
        assert any(k == "phase" for k, *_ in bars) and any(k == "op" for k, *_ in bars), host
        assert all(0 <= float(left) <= 100 and float(left) + float(width) <= 100.001
                   for _, _, left, width in bars), bars
    gpu02 = found["host-gpu-02"]
    assert 'class="bar phase s-failed"' in gpu02 and 'class="bar op s-failed"' in gpu02
    assert 'class="bar op s-changed"' in found["host-cp-01"]
    assert 'class="bar phase s-warning"' in found["host-gpu-01"]  # its node phase
    assert "join | kubeadm join" in gpu02  # the tooltip names the op


def test_bars_are_placed_by_started_or_one_after_another(tmp_path: Path) -> None:
    def kubeadm_join_left(report: dict[str, Any], name: str) -> float:
        page = htmlreport.render(make_run(tmp_path, report, name))
        cpu = sections(page)["host-cpu-01"]
        return float(re.search(r'style="left:([\d.]+)%[^>]*title="join \| kubeadm join',
                               cpu)[1])

    # started: 8.0 of 12.5 s; sequential: node (4 s) then control-plane (3 s) = 7.0 of 12.5
    assert kubeadm_join_left(four_host_report(), "20261127-000001-bootstrap") == \
        pytest.approx(8.0 / 12.5 * 100, abs=0.01)
    assert kubeadm_join_left(four_host_report(new_schema=False),
                             "20261127-000002-bootstrap") == pytest.approx(7.0 / 12.5 * 100,
                                                                           abs=0.01)


def test_header_changes_failures_log_tail_and_cluster(tmp_path: Path) -> None:
    page = htmlreport.render(make_run(tmp_path))
    meta = page.split("<h2>Timeline</h2>")[0]
    assert "bootstrap" in meta and "2026-11-27T05:04:16" in meta and "12.50s" in meta
    assert re.search(r"failed hosts</td><td>gpu-02<", meta)
    changed = page.split("<h2>What changed</h2>")[1].split("<h2>")[0]
    for host in HOSTS:
        assert f"<h3>{host} (" in changed
    assert "+ install containerd.io" in changed and "+ kubeadm init" in changed
    assert "= curl 7.88" not in changed  # ok ops are not changes
    failures = page.split("<h2>Failures</h2>")[1].split("<h2>Cluster</h2>")[0]
    assert "<h3>gpu-02</h3>" in failures and "port 10250" in failures
    assert "gpu-02 line 60" in failures and "gpu-02 line 21\n" in failures
    assert "gpu-02 line 20\n" not in failures  # only the last 40 lines
    assert "cp-01 line" not in failures
    cluster = page.split("<h2>Cluster</h2>")[1]
    assert '<table class="cluster">' in cluster
    assert "<td>gpu-01</td><td>Ready</td><td></td><td>v1.36.2</td><td>2</td>" in cluster
    # self-contained: no external URL, no script, a CSP that forbids both
    assert not re.search(r"(src|href)=|https?://|<script|@import", page, re.I)
    assert "default-src 'none'" in page


def test_no_op_run_and_missing_cluster(tmp_path: Path) -> None:
    report = four_host_report()
    report.pop("cluster")
    report["failed_hosts"] = {}
    report["steps"] = []
    for phase in report["phases"]:
        for res in phase["hosts"].values():
            res.update(elapsed=0.0, error=None, ops=[])
    page = htmlreport.render(make_run(tmp_path, report))
    found = sections(page)
    assert all('class="bar phase s-ok"' in found[f"host-{h}"] for h in HOSTS)
    assert "Nothing changed." in page and "No failures." in page
    assert "not recorded" in page.split("<h2>Cluster</h2>")[1]


def parsed(page: str) -> tuple[set[str], set[str]]:
    """Every tag and attribute name of the page, as a browser's parser sees them."""
    tags: set[str] = set()
    attrs: set[str] = set()

    class Collect(HTMLParser):
        def handle_starttag(self, tag: str, found: list[tuple[str, str | None]]) -> None:
            tags.add(tag)
            attrs.update(name for name, _ in found)

    Collect().feed(page)
    return tags, attrs


EVIL_HOST = "<script>alert(1)</script>"
EVIL_REASON = '" onmouseover="x'


def test_untrusted_text_is_escaped_everywhere(tmp_path: Path) -> None:
    report = four_host_report()
    join = report["phases"][2]["hosts"]
    join[EVIL_HOST] = copy.deepcopy(join.pop("gpu-02"))
    join[EVIL_HOST]["ops"][0]["reason"] = EVIL_REASON
    join[EVIL_HOST]["ops"][0]["id"] = "x' onclick='y"
    join[EVIL_HOST]["error"] = "</pre><img src=x onerror=alert(2)>"
    report["failed_hosts"] = {EVIL_HOST: {"status": "<b>failed</b>", "cause": "\x1b[31m"},
                              "../outside": {"status": "failed", "cause": "gone"},
                              'gpu-03"><b>': {"status": "failed", "cause": "unreachable"}}
    report["cluster"]["nodes"][0]["name"] = "<iframe src=//x>"
    report["command"] = "</title><script>alert(3)</script>"
    report["phases"][0]["hosts"]["cp-01"]["ops"][0]["status"] = '"><script>'
    report["phases"][0]["elapsed"] = "1;background:url(//x)"
    run = make_run(tmp_path, report)
    (run / 'gpu-03"><b>.log').write_text("</pre><script>alert(4)</script>\n")
    (tmp_path / "outside.log").write_text("SECRET OUTSIDE THE RUN FOLDER\n")
    page = htmlreport.render(run)
    for raw in (EVIL_HOST, EVIL_REASON, "x' onclick='y", "<img", "<iframe", "<b>",
                "</title><script>", '"><script>', "url(//x)", "\x1b"):
        assert raw not in page, raw
    tags, attrs = parsed(page)
    assert tags <= {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p",
                    "table", "tr", "td", "th", "section", "div", "span", "i", "small", "pre",
                    "details", "summary"}, tags
    assert attrs <= {"lang", "charset", "http-equiv", "content", "class", "id", "style",
                     "title"}, attrs
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&quot; onmouseover=&quot;x" in page and "x&#x27; onclick=&#x27;y" in page
    assert "&lt;/pre&gt;&lt;script&gt;alert(4)" in page  # its log tail, escaped
    assert "\\x1b[31m" in page  # control characters shown, not sent to the browser
    assert 'id="host-_script_alert_1___script_"' in page
    assert "SECRET OUTSIDE" not in page  # a host name never reaches outside the run folder
    assert htmlreport.host_id("gpu 01", set()) == "host-gpu_01"
    taken: set[str] = set()
    assert [htmlreport.host_id(h, taken) for h in ("a.b", "a_b")] == ["host-a_b", "host-a_b-2"]


def test_write_is_0600_and_the_command_defaults_to_the_latest_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        ) -> None:
    runs = tmp_path / "runs"
    make_run(runs, name="20261127-040000-bootstrap")
    latest = make_run(runs, name="20261127-050416-bootstrap")
    (runs / "bench-20261128-000000").mkdir()  # not a run folder
    (runs / "20261129-000000-notes.txt").write_text("not a folder")
    monkeypatch.setenv("GPUK8S_RUNS_DIR", str(runs))
    before = sorted(p.name for p in runs.iterdir())
    assert cli.run("report") == 0
    path = latest / "report.html"
    assert capsys.readouterr().out.strip() == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "host-gpu-02" in path.read_text()
    assert sorted(p.name for p in runs.iterdir()) == before  # report makes no run folder
    older = runs / "20261127-040000-bootstrap"
    assert cli.main(["report", "--run", str(older)]) == 0
    assert (older / "report.html").exists()


def test_clear_errors_for_a_bad_run_folder(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "20261127-050416-bootstrap"
    empty.mkdir()
    with pytest.raises(RunFolderError, match=r"has no report\.json"):
        htmlreport.render(empty)
    assert cli.run("report", run=str(empty)) == 1
    err = capsys.readouterr().err
    assert "report.json" in err and "fix:" in err
    (empty / "report.json").write_text('{"command": "bootstrap", "phases": [')
    with pytest.raises(RunFolderError, match="not valid JSON") as exc:
        htmlreport.render(empty)
    assert exc.value.fix
    (empty / "report.json").write_text("[1, 2]")
    with pytest.raises(RunFolderError, match="JSON object"):
        htmlreport.render(empty)
    with pytest.raises(RunFolderError, match="no such run folder"):
        htmlreport.render(tmp_path / "nope")
    with pytest.raises(RunFolderError, match="no run folder under"):
        htmlreport.latest_run(tmp_path / "nothing-here")


def test_a_password_in_a_field_the_page_does_not_know_is_redacted(tmp_path: Path) -> None:
    """`invoke facts` keeps file contents in report.json (an apt proxy URL with its
    password); the page's "other fields" must not show the password."""
    report = four_host_report()
    report["facts"] = {"cp-01": {"Files": {"/etc/apt/apt.conf.d/90gpuk8s-proxy": {
        "content": 'Acquire::http::Proxy "http://labuser:S3cretPw@proxy:3128";'}}}}
    page = htmlreport.render(make_run(tmp_path, report))
    assert "S3cretPw" not in page and "proxy:3128" in page


def test_a_symlinked_log_or_report_is_named_not_read(tmp_path: Path) -> None:
    """A run folder from someone else whose failed host's log is a symlink to the reader's
    key (review 2, L3): the page says so and holds nothing of the target."""
    secret = tmp_path / "id_ed25519"
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nSECRETKEYMATERIAL\n")
    run = make_run(tmp_path / "ticket")
    (run / "gpu-02.log").unlink()
    (run / "gpu-02.log").symlink_to(secret)
    page = htmlreport.render(run)
    assert "SECRETKEYMATERIAL" not in page and "PRIVATE KEY" not in page
    failures = page.split("<h2>Failures</h2>")[1].split("<h2>Cluster</h2>")[0]
    assert "(gpu-02.log is a symlink: not read)" in failures
    # a hard-to-spot variant: a FIFO (would hang a plain open) and a folder named like a log
    (run / "gpu-02.log").unlink()
    os.mkfifo(run / "gpu-02.log")
    assert "(gpu-02.log is not a regular file: not read)" in htmlreport.render(run)
    # report.json itself a symlink: refused with the fix, the target never parsed
    other = make_run(tmp_path / "ticket", name="20261127-050417-bootstrap")
    (other / "report.json").unlink()
    stolen = tmp_path / "stolen.json"
    stolen.write_text(json.dumps({"command": "SECRETKEYMATERIAL"}))
    (other / "report.json").symlink_to(stolen)
    with pytest.raises(RunFolderError, match=r"report\.json is a symlink: not read") as err:
        htmlreport.render(other)
    assert "SECRETKEYMATERIAL" not in str(err.value) and "fix:" in str(err.value)


def test_an_accept_run_shows_every_figure_reference_source_and_verdict(tmp_path: Path) -> None:
    from gpuk8s.accept.judge import judge
    from gpuk8s.accept.node import parse

    real = (Path(__file__).parents[1] / "fixtures" / "real" / "h200-accept" /
            "2xh200-full.txt").read_text()
    bad = real.replace("MATMUL 1 bf16", "MATMUL 1 bf16 1\nMATMUL 9 bf16").replace(
        "SMI-END 0", "SMI-END 0\n<script>alert(1)</script>")
    result = {**judge(parse(bad)), "action": "quarantined: <b>cordoned</b>"}
    report = {**four_host_report(), "command": "accept", "accept": {"gpu-01": result}}
    page = htmlreport.render(make_run(tmp_path, report))
    assert "<h2>GPU acceptance</h2>" in page
    assert "dense BF16 matmul 656.4 TFLOPS" in page and "measured: docs/real-hardware.md" in page
    assert "<script>alert" not in page and "&lt;b&gt;cordoned" in page
    assert page.count("<td>matmul_bf16</td>") == 2
