"""Output from nodes is untrusted text: Rich never interprets markup (or emoji codes) in it,
and control characters other than newline and tab reach the terminal and the host logs only
as visible escapes (``\\x1b`` as four characters), never as raw bytes."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

import gpuk8s.session as session_mod
from gpuk8s import api, cli, gpucheck, runner
from gpuk8s.errors import Gpuk8sError, PreflightError
from gpuk8s.facts import HostFacts
from gpuk8s.facts.system import OsRelease
from gpuk8s.ops import change, noop, warn
from gpuk8s.redact import Redactor
from gpuk8s.report import Reporter, RunLog, untrusted, untrusted_text
from gpuk8s.transport import ConnectSpec, Counters
from tests.unit.scenarios import fresh_facts
from tests.unit.test_inventory import MINIMAL

HOST = "gpu-01[/x]"
OSC = "\x1b]0;owned\x1b\\"          # set the terminal's title
CLEAR = "\x1b[2J"                   # clear the screen
DRIVER = f"580.95.05 {OSC} {CLEAR} [/x]"


def _reporter() -> tuple[Reporter, io.StringIO]:
    buf = io.StringIO()
    rep = Reporter(buf)
    rep.console.width = 300  # tables keep each cell on one line
    return rep, buf


def _clean(out: str) -> str:
    """No raw ESC (or other C0/C1 control but newline) reached the output."""
    bad = [c for c in out if (ord(c) < 0x20 and c not in "\n\t") or 0x7f <= ord(c) <= 0x9f]
    assert not bad, repr(out)
    return out


# -- the helper --------------------------------------------------------------------------------
def test_untrusted_escapes_c0_c1_but_keeps_newline_and_tab() -> None:
    text = f"a{OSC}\tb\r\nc{CLEAR}\x00\x7f\x9b\u202e\rd [/x]"
    assert untrusted(text) == ("a\\x1b]0;owned\\x1b\\\tb\nc\\x1b[2J\\x00\\x7f\\x9b\\u202e"
                               "\\x0dd [/x]")
    assert untrusted(12) == "12"
    cell = untrusted_text("[bold]x[/bold]", style="red")
    assert cell.plain == "[bold]x[/bold]" and str(cell.style) == "red"


# -- the plan, preflight and the final table -------------------------------------------------
def test_plan_prints_hostile_host_and_reasons_literally() -> None:
    rep, buf = _reporter()
    ops = [change("base | x", f"+ [bold]install[/bold] driver {DRIVER}", "true",
                  diff=f"+[/x] {CLEAR}"),
           noop("base | y", "= kernel 6.8[/x] already"),
           warn("base | z", f"! PRETTY_NAME Foo [/x] {OSC}")]
    assert rep.plan({HOST: ops}, show_all=True, diff=True) == 1
    out = _clean(buf.getvalue())
    assert f"{HOST}: 1 change(s)" in out
    assert "+ [bold]install[/bold] driver 580.95.05 \\x1b]0;owned\\x1b\\ \\x1b[2J [/x]" in out
    assert "= kernel 6.8[/x] already" in out and "! PRETTY_NAME Foo [/x] \\x1b]0;owned" in out
    assert "+[/x] \\x1b[2J" in out


def test_preflight_problems_and_warnings_print_node_text_literally() -> None:
    rep, buf = _reporter()
    rep.warnings({HOST: [("swap", f"swap on [/x] {CLEAR}", "")]})
    rep.problems("preflight problems", {HOST: [("os", "Foo [/x] is not supported",
                                                f"reinstall {OSC}[/y]")]})
    out = _clean(buf.getvalue())
    assert f"! {HOST}: swap on [/x] \\x1b[2J (swap)" in out
    assert f"preflight problems: {HOST}" in out
    assert "Foo [/x] is not supported" in out and "reinstall \\x1b]0;owned\\x1b\\[/y]" in out


def test_summary_progress_and_print_escape_node_text() -> None:
    rep, buf = _reporter()
    rep.start([HOST])
    rep.event(HOST, "op", f"driver {DRIVER}")
    rep.event(HOST, "fail", f"nvidia-smi: {OSC}[/x] failed\nmore")
    rep.stop()
    rep.console.print(rep.progress)            # what the live view shows on a TTY
    rep.summary({HOST: {"changed": 1, "ok": 0, "failed": 1, "time": 1.0}}, 1.0,
                failed={HOST: {"status": "failed", "cause": f"{CLEAR}[/x] boom"}})
    rep.phase(f"node: {HOST}")
    rep.print(f"gpu-01: driver 580 {OSC} {CLEAR} :thumbs_up:")
    out = _clean(buf.getvalue())
    assert f"[{HOST}] -> driver 580.95.05 \\x1b]0;owned\\x1b\\ \\x1b[2J [/x]" in out
    assert f"[{HOST}] FAILED nvidia-smi: \\x1b]0;owned\\x1b\\[/x] failed" in out
    assert f"{HOST} failed: \\x1b[2J[/x] boom" in out
    assert f"== node: {HOST}" in out
    assert "gpu-01: driver 580 \\x1b]0;owned\\x1b\\ \\x1b[2J :thumbs_up:" in out


def test_host_log_escapes_control_characters(tmp_path: Path) -> None:
    log = RunLog(tmp_path, "plan", Redactor())
    log.host_logger("gpu-01")(f"driver {DRIVER}\r\nline two\tok")
    text = (log.path / "gpu-01.log").read_text()
    assert _clean(text).endswith("driver 580.95.05 \\x1b]0;owned\\x1b\\ \\x1b[2J [/x]\n"
                                 "line two\tok\n")


def test_cli_error_escapes_control_characters(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    def boom(**_: Any) -> None:
        raise Gpuk8sError(f"gpu-01: nvidia-smi failed: {OSC} {CLEAR} [/x]")

    monkeypatch.setitem(cli.COMMANDS, "status", boom)
    assert cli.run("status") == 1
    err = capsys.readouterr().err
    assert _clean(err) == "error: gpu-01: nvidia-smi failed: \\x1b]0;owned\\x1b\\ \\x1b[2J [/x]\n"


# -- end to end: invoke plan over a node whose PRETTY_NAME is hostile ------------------------
class _Transport:
    def __init__(self, name: str) -> None:
        self.name = name
        self.counters = Counters()

    def close(self) -> None:
        return None


def test_plan_with_hostile_pretty_name_shows_preflight_problem(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUK8S_RUNS_DIR", str(tmp_path / "runs"))
    inv = tmp_path / "hosts.yaml"
    inv.write_text(MINIMAL)

    def gather(session: session_mod.Session, hosts: list[str]) -> None:
        for h in hosts:
            facts = fresh_facts("ubuntu2404", 1 if h.startswith("gpu") else 0, h,
                                dict(session_mod.role_vars(session.host(h))))
            if h == "gpu-01":
                facts = HostFacts(h, {f: ({"ID": "foo", "VERSION_ID": "1",
                                           "PRETTY_NAME": f"Foo [/x] {CLEAR}"}
                                          if isinstance(f, OsRelease) else v)
                                      for f, v in facts.items()})
            session.facts[h] = facts

    monkeypatch.setattr(runner, "gather", gather)

    def opener(spec: ConnectSpec, redact: Redactor) -> _Transport:
        return _Transport(spec.name)

    rep, buf = _reporter()
    with pytest.raises(PreflightError):
        api.plan(inv, reporter=rep, opener=opener)
    out = _clean(buf.getvalue())
    assert "Foo [/x] \\x1b[2J is not supported" in out


# -- the node GPU check ------------------------------------------------------------------------
@pytest.mark.parametrize("line", ["SMI-GPUS x", "SMI-GPUS", "SMI-GPUS 1 2",
                                  "SMI-GPUS " + "9" * 5000])
def test_parse_check_malformed_count_fails_the_host(line: str) -> None:
    row = gpucheck.parse_check(f"{line}\nRUNNER nvcc 12.8\nOK GPU 0 H100: vecadd\n", 0, 1)
    assert row["ok"] is False and row["nvidia_smi_gpus"] == 0
    assert row["error"].startswith("malformed nvidia-smi count line from the check: 'SMI-GPUS")


def test_gpu_check_table_prints_node_text_literally() -> None:
    rep, buf = _reporter()
    row = gpucheck.parse_check(f"SMI-GPUS 1\nRUNNER torch 2.9[/x]\nFAIL GPU 0 H100 {OSC}: 1 "
                               f"wrong\n{CLEAR}[/x] oops\n", 1, 1)
    gpucheck._print(rep, [{"host": HOST, "driver": DRIVER, **row},
                          {"host": "gpu-02", "driver": "580",
                           **gpucheck.parse_check("SMI-GPUS x\n", 0, 1)}])
    out = _clean(buf.getvalue())
    for text in (HOST, "580.95.05 \\x1b]0;owned", "torch 2.9[/x]", "H100 \\x1b]0;owned",
                 "FAILED", "wrong results on GPU 0", "malformed nvidia-smi count line"):
        assert text in out, text
    # the raw output is the error's and the run log's, not the table's: the error goes to the
    # terminal through untrusted (cli._error)
    assert "oops" not in out and f"{CLEAR}[/x] oops" in row["error"]
    json.dumps(row)  # the row still goes to report.json as is


def test_status_and_pod_tables_print_cluster_text_literally() -> None:
    from gpuk8s.day2.status import _print_status
    from gpuk8s.workloads import PodRow, WaitResult, pod_table
    rep, buf = _reporter()
    _print_status(rep, [{"host": "gpu-01", "role": "worker", "state": "Ready",
                         "kubelet": f"v1.36[/x]{CLEAR}", "containerd": "2.1[bold]",
                         "driver": "580", "cuda": "", "gpus": 1, "gpu_model": "H100",
                         "allocatable_gpu": 1, "drift": ""}], False, wide=True)
    pod_table(rep, "pods [/x]", WaitResult(True, [PodRow("p[/x]", "n", f"Fail[/x]{CLEAR}", 1,
                                                          "[red]boom")], [], {}))
    out = _clean(buf.getvalue())
    assert "v1.36[/x]\\x1b[2J" in out and "2.1[bold]" in out
    assert "pods [/x]" in out and "p[/x]" in out and "[red]boom" in out


def test_status_prints_xids_unhealthy_gpus_and_quarantines_literally() -> None:
    from gpuk8s.day2.status import _print_status
    rep, buf = _reporter()
    _print_status(rep, [{
        "host": "gpu-01", "role": "worker", "state": "Ready", "gpus": 2, "allocatable_gpu": 1,
        "drift": 0, "unhealthy_gpus": 1,
        "xids": [{"xid": 31, "bus": "00:06.0", "uptime_s": 10.0, "fatal": False, "text": "x"},
                 {"xid": 79, "bus": f"00:07.0[/x]{CLEAR}", "uptime_s": 1843.3, "fatal": True,
                  "text": "GPU has fallen off the bus."}],
        "gpu_quarantine": {"reason": "xid-79", "detail": "GPU 1: Xid 79 [bold]x[/bold]"}}],
        False)
    out = _clean(buf.getvalue())
    assert "Ready (GPU quarantine)" in out
    assert "gpu-01: 2 Xid event(s) since boot (1 needing a GPU reset or a reboot); last: Xid 79" \
        in out and "00:07.0[/x]\\x1b[2J" in out
    assert "the device plugin reports 1 GPU(s) unhealthy" in out
    assert "gpu-01 is quarantined (gpuk8s.io/gpu-unhealthy=xid-79): GPU 1: Xid 79 " \
        "[bold]x[/bold]; after fixing it: invoke release --host gpu-01" in out
