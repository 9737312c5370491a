"""Every table gpuk8s prints, read by a person at 80 columns (issue 30): the default view fits
80 columns with typical values (host names of 20 characters), no cell is ever cut, folded or
ellipsized, a pipe gets plain aligned text without box drawing (as ``kubectl get``), and
``-o wide`` shows every column. Rendered on a terminal (Rich) and into a pipe."""

from __future__ import annotations

import io
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import gpuk8s.gather as gather_mod
import gpuk8s.session as session_mod
from gpuk8s import cli, day2, gpucheck
from gpuk8s.day2.gpuusage import COLUMNS as USAGE_COLUMNS
from gpuk8s.day2.gpuusage import _print as print_usage
from gpuk8s.day2.status import STATUS_COLUMNS, _print_status
from gpuk8s.facts import HostFacts
from gpuk8s.facts.system import OsRelease
from gpuk8s.redact import Redactor
from gpuk8s.report import Column, Reporter, table_lines
from gpuk8s.transport import ConnectSpec, Counters
from gpuk8s.workloads import PodRow, WaitResult, pod_table
from gpuk8s.workloads.verify import NodeCheck
from gpuk8s.workloads.verify import _print as print_verify
from tests.unit.scenarios import fresh_facts

#: box drawing (Rich's table borders)
BOX = re.compile(r"[\u2500-\u257f]")
#: typical names: 20 characters, as long as a default view is made for
CP, GPU1, GPU2, CPU = ("ctrl-plane-rack01-01", "dgx-h200-rack04-n017", "dgx-h200-rack04-n018",
                       "cpu-general-rack9-02")


def reporter(tty: bool, width: int = 80) -> tuple[Reporter, io.StringIO]:
    """A Reporter writing to a terminal ``width`` columns wide (``tty``) or to a pipe, as
    COLUMNS=``width`` would make it."""
    buf = io.StringIO()
    rep = Reporter(buf)
    rep.console = Console(file=buf, force_terminal=tty, color_system=None, width=width,
                          highlight=False, soft_wrap=True, emoji=False)
    return rep, buf


def check(out: str, tty: bool, cells: Sequence[str], *, width: int | None = 80) -> None:
    """No line wider than ``width``; every cell whole on one line; no box drawing in a pipe."""
    lines = out.splitlines()
    assert lines, "nothing printed"
    if width is not None:
        assert max(len(x) for x in lines) <= width, out
    for cell in cells:
        assert any(cell in line for line in lines), f"{cell!r} not whole in\n{out}"
    if not tty:
        assert not BOX.search(out), out


MODES = pytest.mark.parametrize("tty", [False, True], ids=["pipe", "tty"])


# -- the helper --------------------------------------------------------------------------------
@MODES
def test_a_table_too_wide_for_the_terminal_is_plain_text_with_every_cell_whole(
        tty: bool) -> None:
    rep, buf = reporter(tty)
    long = "x" * 70
    rep.table("t", ["name", "value"], [["a", long], ["bb", "short"]])
    out = buf.getvalue()
    check(out, False, ["a", long, "short"], width=None)  # plain text, even on a terminal
    assert out.splitlines()[1:] == ["NAME  VALUE", "a     " + long, "bb    short"]


def test_a_table_that_fits_the_terminal_is_a_rich_table() -> None:
    rep, buf = reporter(True)
    rep.table("t", ["name", "value"], [["a", "b"]])
    assert BOX.search(buf.getvalue())


def test_plain_table_columns_align_and_right_justify() -> None:
    lines = [x.plain for x in table_lines(
        [Column("a"), Column("n", justify="right"), Column("c")],
        [[_t("x"), _t("7"), _t("")], [_t("yyy"), _t("12"), _t("two\nlines")]])]
    assert lines == ["A     N  C", "x     7", "yyy  12  two", "         lines"]


def test_wide_columns_only_with_wide() -> None:
    cols = [Column("a"), Column("b", wide=True)]
    for wide, want in ((False, ["A", "1"]), (True, ["A  B", "1  2"])):
        rep, buf = reporter(False)
        rep.table("", cols, [["1", "2"]], wide=wide)
        assert buf.getvalue().splitlines() == want


def test_table_cells_are_never_markup() -> None:
    rep, buf = reporter(True)
    rep.table("t [/x]", ["a"], [["[red]boom[/red] \x1b[2J"]])
    assert "[red]boom[/red] \\x1b[2J" in buf.getvalue()


def _t(text: str) -> Any:
    from rich.text import Text
    return Text(text)


# -- status ------------------------------------------------------------------------------------
def status_rows() -> list[dict[str, Any]]:
    node = {"kubelet": "1.36.2", "containerd": "2.1.4", "driver": "580.95.05",
            "cuda": "12.8,13.0", "cordoned": False}
    return [
        {"host": CP, "role": "control-plane", "node": CP, "state": "Ready", **node,
         "driver": "", "cuda": "", "gpus": 0, "gpu_model": "", "allocatable_gpu": None,
         "drift": 0, "control_plane": "etcd healthy, API ready", "etcd_healthy": True,
         "etcd_members": [CP], "api_ready": True},
        {"host": GPU1, "role": "worker", "node": GPU1, "state": "Ready", **node,
         "cordoned": True, "gpus": 8, "gpu_model": "NVIDIA H200", "allocatable_gpu": 8,
         "gpu_util": 37.4, "drift": 19},
        {"host": GPU2, "role": "worker", "node": GPU2, "state": "NotReady", **node, "gpus": 8,
         "gpu_model": "NVIDIA H200", "allocatable_gpu": 0, "gpu_util": None, "drift": None,
         "preflight": [{"check": "os", "problem": "Foo 1 is not supported",
                        "fix": "use Ubuntu"}]},
        {"host": CPU, "role": "worker", "state": "unreachable", "error": "timed out"},
        {"host": "cpu-03", "role": "worker", "state": "absent"},
    ]


STATUS_DEFAULT = [CP, GPU1, GPU2, CPU, "control-plane", "Ready (cordoned)", "NotReady",
                  "unreachable", "absent", "19 changes", "in sync", "refused"]
STATUS_WIDE = ["580.95.05", "12.8,13.0", "1.36.2", "2.1.4", "NVIDIA H200", "37 %", "unknown",
               "etcd healthy, API ready"]


@MODES
def test_status_default_view_fits_80_columns(tty: bool) -> None:
    rep, buf = reporter(tty)
    _print_status(rep, status_rows(), False)
    out = buf.getvalue()
    check(out, tty, STATUS_DEFAULT)
    assert "NVIDIA H200" not in out and "580.95.05" not in out  # -o wide's


@MODES
def test_status_wide_has_every_column_and_every_cell(tty: bool) -> None:
    rep, buf = reporter(tty)
    _print_status(rep, status_rows(), False, wide=True)
    out = buf.getvalue()
    check(out, tty, STATUS_DEFAULT + STATUS_WIDE, width=None)
    header = out.lower()
    for col in STATUS_COLUMNS:
        assert col.header.lower() in header, col


def test_status_in_a_pipe_is_one_line_per_host_with_a_field_per_column() -> None:
    rep, buf = reporter(False)
    _print_status(rep, status_rows(), False)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "cluster status"
    assert lines[1].split() == ["HOST", "ROLE", "STATE", "GPUS", "OFFERED", "PLAN"]
    by_host = {x.split()[0]: x.split() for x in lines[2:7]}
    assert by_host[GPU1] == [GPU1, "worker", "Ready", "(cordoned)", "8", "8", "19", "changes"]
    assert by_host[CP] == [CP, "control-plane", "Ready", "0", "-", "in", "sync"]
    assert by_host["cpu-03"] == ["cpu-03", "worker", "absent", "-", "-", "-"]


@MODES
def test_status_says_a_refused_host_is_refused_by_preflight_and_why(tty: bool) -> None:
    rep, buf = reporter(tty)
    _print_status(rep, status_rows(), False)
    out = buf.getvalue()
    line = next(x for x in out.splitlines() if x.lstrip("│ ").startswith(GPU2))
    assert "refused" in line and not re.search(r"\b\d+ changes?\b", line)
    assert f"{GPU2} is refused by preflight" in out
    assert "os: Foo 1 is not supported" in out


class _Transport:
    def __init__(self, name: str) -> None:
        self.name = name
        self.counters = Counters()

    def close(self) -> None:
        return None


INVENTORY = """\
all:
  vars:
    ansible_user: ubuntu
  children:
    control_plane:
      hosts:
        cp-01: {ansible_host: 10.0.0.10}
    workers:
      hosts:
        gpu-01: {ansible_host: 10.0.0.21}
        gpu-02: {ansible_host: 10.0.0.22}
    gpu:
      hosts:
        gpu-01:
        gpu-02:
"""


def test_status_of_a_host_plan_refuses_is_no_drift_count(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real-host report: status said "drift 19" of a host that plan refuses at
    preflight. Now its row carries preflight's problems and no drift, and the table says
    refused; a host preflight accepts still has its count."""
    monkeypatch.setenv("GPUK8S_RUNS_DIR", str(tmp_path / "runs"))
    inv = tmp_path / "hosts.yaml"
    inv.write_text(INVENTORY)

    def gather(session: session_mod.Session, hosts: list[str]) -> None:
        for h in hosts:
            facts = fresh_facts("ubuntu2404", 1 if h.startswith("gpu") else 0, h,
                                dict(session_mod.role_vars(session.host(h))))
            if h == "gpu-01":  # an OS preflight refuses
                facts = HostFacts(h, {f: ({"ID": "foo", "VERSION_ID": "1",
                                           "PRETTY_NAME": "Foo 1"}
                                          if isinstance(f, OsRelease) else v)
                                      for f, v in facts.items()})
            session.facts[h] = facts

    monkeypatch.setattr(gather_mod, "gather", gather)  # gathered_session's

    def opener(spec: ConnectSpec, redact: Redactor) -> _Transport:
        return _Transport(spec.name)

    rep, buf = reporter(False)
    rows = {r["host"]: r for r in day2.status(inv, reporter=rep, opener=opener)}
    assert rows["gpu-01"]["drift"] is None
    assert [p["check"] for p in rows["gpu-01"]["preflight"]] == ["os"]
    assert "Foo 1 is not supported" in rows["gpu-01"]["preflight"][0]["problem"]
    assert rows["gpu-02"]["drift"] > 0 and "preflight" not in rows["gpu-02"]
    out = buf.getvalue()
    line = next(x for x in out.splitlines() if x.startswith("gpu-01 "))
    assert line.split()[-1] == "refused", out
    assert "gpu-01 is refused by preflight" in out and "Foo 1 is not supported" in out
    check(out, False, ["gpu-01", "gpu-02", "cp-01"])


# -- gpu-usage --------------------------------------------------------------------------------
def usage_rows() -> list[dict[str, Any]]:
    return [{"node": GPU1, "gpu": str(i), "model": "NVIDIA H200",
             "uuid": f"GPU-8a3b0f52-1c2d-4e5f-9a0b-1c2d3e4f5a6{i}", "util": 100.0 if i else 3.0,
             "used": 81559.0, "free": 62000.0, "pods": ["jupyter/jupyter-0"] if i else []}
            for i in range(2)]


@MODES
def test_gpu_usage_default_view_fits_80_columns(tty: bool) -> None:
    rep, buf = reporter(tty)
    print_usage(rep, usage_rows(), False)
    out = buf.getvalue()
    check(out, tty, [GPU1, "100 %", "3 %", "81559", "62000", "jupyter/jupyter-0"])


@MODES
def test_gpu_usage_wide_has_every_column(tty: bool) -> None:
    rep, buf = reporter(tty)
    print_usage(rep, usage_rows(), False, wide=True)
    out = buf.getvalue()
    check(out, tty, ["NVIDIA H200", "GPU-8a3b0f52-1c2d-4e5f-9a0b-1c2d3e4f5a61"], width=None)
    for col in USAGE_COLUMNS:
        assert col.header.lower() in out.lower(), col


# -- the run's result, deploy's pods, verify, verify --local ---------------------------------
TableFn = Callable[[Reporter], Sequence[str]]


def _summary(rep: Reporter) -> Sequence[str]:
    rep.summary({CP: {"changed": 3, "ok": 120, "failed": 0, "time": 61.25},
                 GPU1: {"changed": 0, "ok": 140, "failed": 1, "time": 302.5}}, 310.0,
                failed={GPU1: {"status": "failed", "cause": "apt-get exited 100"}})
    return [CP, GPU1, "120", "140", "61.2s", "302.5s", "failed"]


def _pods(rep: Reporter) -> Sequence[str]:
    pods = [PodRow("jupyter-7d9f8b6c5d-x2x4z", GPU1, "Running", 1),
            PodRow("verify-smi-n017-8kq2p", GPU2, "Succeeded", 8)]
    pod_table(rep, "jupyter: pods", WaitResult(True, pods, [], {"Deployment/jupyter": "ready"}))
    return ["jupyter-7d9f8b6c5d-x2x4z", "verify-smi-n017-8kq2p", "Running", "Succeeded",
            GPU1, GPU2]


def _verify(rep: Reporter) -> Sequence[str]:
    ok = NodeCheck(GPU1, 8, 8, smi=["NVIDIA H200"] * 8, tf=8, dcgm=8)
    bad = NodeCheck(GPU2, 8, 7, smi=["NVIDIA H200"] * 7, tf=7, dcgm=8,
                    problem="nvidia-smi in the pod sees 7 of the node's 8 GPUs")
    print_verify(rep, [ok, bad], True)
    return [GPU1, GPU2, "ok", "FAIL", "nvidia-smi in the pod sees 7 of the node's 8 GPUs"]


def _verify_local(rep: Reporter) -> Sequence[str]:
    good = gpucheck.parse_check("SMI-GPUS 2\nRUNNER nvcc 12.8\nARCH -arch=sm_90\n"
                                "OK GPU 0 NVIDIA H200: vecadd 16777216 ok\n"
                                "OK GPU 1 NVIDIA H200: vecadd 16777216 ok\n", 0, 2)
    bad = gpucheck.parse_check("SMI-GPUS 1\nRUNNER nvcc 12.8\n"
                               "OK GPU 0 NVIDIA H200: vecadd 16777216 ok\n", 1, 2)
    gpucheck._print(rep, [{"host": GPU1, "driver": "580.95.05", **good},
                          {"host": GPU2, "driver": "580.95.05", **bad}])
    return [GPU1, GPU2, "580.95.05", "ok", "FAILED", "OK GPU 1 NVIDIA H200: vecadd 16777216 ok"]


@MODES
@pytest.mark.parametrize("fn", [_summary, _pods, _verify, _verify_local],
                         ids=["summary", "pods", "verify", "verify-local"])
def test_table_fits_80_columns_and_cuts_no_cell(tty: bool, fn: TableFn) -> None:
    rep, buf = reporter(tty)
    cells = fn(rep)
    check(buf.getvalue(), tty, cells)


def test_problems_are_lines_not_a_table_folded_to_a_few_letters() -> None:
    rep, buf = reporter(True)
    problem = ("the control plane's address is 127.0.0.1, so the API endpoint would be "
               "127.0.0.1:6443")
    rep.problems("preflight problems", {CP: [("endpoint", problem, "set ansible_host")]})
    out = buf.getvalue()
    assert f"endpoint: {problem}" in out and "fix: set ansible_host" in out
    assert not BOX.search(out)


# -- the options --------------------------------------------------------------------------------
def test_output_option_of_status_and_gpu_usage(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []
    for name in ("status", "gpu_usage"):
        monkeypatch.setitem(cli.COMMANDS, name, lambda **kw: seen.append(kw))
    assert cli.main(["status", "-i", "x", "-o", "wide"]) == 0
    assert cli.main(["gpu-usage", "-i", "x", "--output", "json"]) == 0
    assert cli.main(["status", "-i", "x"]) == 0
    assert seen == [{"inventory": "x", "as_json": False, "wide": True},
                    {"inventory": "x", "as_json": True, "wide": False},
                    {"inventory": "x", "as_json": False, "wide": False}]
    assert cli.table_output("", True) == {"as_json": True, "wide": False}
    with pytest.raises(ValueError, match="wide"):
        cli.table_output("yaml")


def test_invoke_status_takes_output_wide() -> None:
    assert "output" in cli.status.help and "output" in cli.gpu_usage.help
    assert cli._table_output("wide", False) == {"as_json": False, "wide": True}


def test_rich_reads_columns_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """COLUMNS=80 is what the lab test and a person's terminal set: the helper's width."""
    monkeypatch.setitem(os.environ, "COLUMNS", "80")
    assert Reporter(io.StringIO()).console.width == 80
