"""--max-fail: how many hosts may fail (unreachable at the start, failing in a phase) while
the others go on; failed hosts are left out of later phases, shown in the final table and
report.json, and the run still ends in an error naming them."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

import gpuk8s.session as session_mod
from gpuk8s import api, runner
from gpuk8s.errors import CommandFailed, ConnectError, Gpuk8sError, HostsFailed, PhaseFailed
from gpuk8s.executor import HostResult, RoleWork
from gpuk8s.ops import change
from gpuk8s.redact import Redactor
from gpuk8s.report import Reporter
from gpuk8s.transport import ConnectSpec, Counters
from tests.unit.test_inventory import MINIMAL


@pytest.mark.parametrize("value, hosts, budget", [
    (0, 4, 0), ("1", 4, 1), ("25%", 4, 1), ("49%", 4, 1), ("50%", 4, 2), ("100%", 3, 3),
    (" 2 ", 10, 2), ("0%", 10, 0)])
def test_fail_budget(value: Any, hosts: int, budget: int) -> None:
    assert runner.fail_budget(value, hosts) == budget


@pytest.mark.parametrize("value", ["-1", "x", "150%", "1.5", "%"])
def test_bad_max_fail_is_one_clear_error(value: str) -> None:
    with pytest.raises(Gpuk8sError, match="--max-fail must be a count like 1"):
        runner.fail_budget(value, 4)


class FakeTransport:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False
        self.counters = Counters()

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """bootstrap over fake hosts: every phase has one change per host; ``down`` hosts are
    unreachable, ``broken`` maps phase -> hosts whose apply fails there."""
    monkeypatch.setenv("GPUK8S_RUNS_DIR", str(tmp_path / "runs"))
    state: dict[str, Any] = {"down": set(), "broken": {}, "phases": []}
    inv = tmp_path / "hosts.yaml"
    inv.write_text(MINIMAL.replace("absent: true", "absent: false"))

    def opener(spec: ConnectSpec, redact: Redactor) -> FakeTransport:
        if spec.name in state["down"]:
            raise ConnectError(spec.name, f"cannot connect to {spec.address}:22: timed out")
        return FakeTransport(spec.name)

    def gather(session: session_mod.Session, hosts: list[str]) -> None:
        for h in hosts:
            session.facts[h] = {}  # type: ignore[assignment]

    def plan_phase(session: session_mod.Session, phase: Any, hosts: list[str]
                   ) -> dict[str, list[RoleWork]]:
        return {h: [RoleWork(phase.roles[0], (change(f"{phase.name} | x", "+ x", "true"),))]
                for h in hosts}

    def apply_phase(session: session_mod.Session, phase: Any, work: Any) -> dict[str, HostResult]:
        state["phases"].append((phase.name, sorted(work)))
        out = {}
        for h in work:
            res = HostResult(h)
            if h in state["broken"].get(phase.name, ()):
                res.error = CommandFailed(h, f"{phase.name} | x", "true", 1, "boom")
            out[h] = res
        return out

    for name, fn in {"gather": gather, "plan_phase": plan_phase, "apply_phase": apply_phase,
                     "cluster_values": lambda s: None, "preflight": lambda s: None,
                     "mint_join": lambda s: None, "fetch_admin_conf": lambda s: None,
                     "cluster_summary": lambda s, fresh: {}}.items():
        monkeypatch.setattr(runner, name, fn)
    state["run"] = lambda **kw: api.bootstrap(inv, yes=True, opener=opener,
                                              reporter=Reporter(state.setdefault(
                                                  "out", io.StringIO())), **kw)
    return state


def test_default_stops_at_the_first_failed_phase(fake_run: dict[str, Any]) -> None:
    fake_run["broken"] = {"node": {"gpu-02"}}
    with pytest.raises(PhaseFailed) as err:
        fake_run["run"]()
    assert err.value.phase == "node" and not isinstance(err.value, HostsFailed)
    assert [p for p, _ in fake_run["phases"]] == ["node"]


def test_unreachable_at_start_with_max_fail_the_rest_converge(fake_run: dict[str, Any]) -> None:
    fake_run["down"] = {"cpu-01"}
    with pytest.raises(PhaseFailed, match="connect"):
        fake_run["run"]()  # default 0: nothing runs
    assert fake_run["phases"] == []
    with pytest.raises(HostsFailed) as err:
        fake_run["run"](max_fail="1")
    assert "cpu-01" in str(err.value) and "cannot connect" in str(err.value)
    assert dict(fake_run["phases"]) == {"node": ["cp-01", "gpu-01", "gpu-02"],
                                        "gpu-lock": ["cp-01", "gpu-01", "gpu-02"],
                                        "control-plane": ["cp-01"], "join": ["gpu-01", "gpu-02"],
                                        "kubelets": ["cp-01", "gpu-01", "gpu-02"],
                                        "gpu-partition": ["cp-01", "gpu-01", "gpu-02"],
                                        "cluster": ["cp-01"], "tenancy": ["cp-01"]}
    out = fake_run["out"].getvalue()
    assert "cpu-01 unreachable: cpu-01: cannot connect" in out
    report = json.loads((Path(err.value.summary["run_dir"]) / "report.json").read_text())
    assert report["failed_hosts"]["cpu-01"]["status"] == "unreachable"


def test_failed_in_a_phase_is_left_out_of_later_phases(fake_run: dict[str, Any]) -> None:
    fake_run["broken"] = {"node": {"gpu-02"}}
    with pytest.raises(HostsFailed) as err:
        fake_run["run"](max_fail="25%")
    assert dict(fake_run["phases"])["join"] == ["cpu-01", "gpu-01"]
    assert err.value.results["gpu-02"].error.op_id == "node | x"
    report = json.loads((Path(err.value.summary["run_dir"]) / "report.json").read_text())
    assert report["failed_hosts"]["gpu-02"] == {"status": "failed",
                                                "cause": "gpu-02: [node | x] exited 1: true"
                                                "\n    boom"}


def test_more_failures_than_allowed_stop_the_run(fake_run: dict[str, Any]) -> None:
    fake_run["down"] = {"cpu-01"}
    fake_run["broken"] = {"node": {"gpu-02"}}
    with pytest.raises(PhaseFailed) as err:
        fake_run["run"](max_fail="1")
    assert err.value.phase == "node" and not isinstance(err.value, HostsFailed)
    assert [p for p, _ in fake_run["phases"]] == ["node"]


def test_a_failed_control_plane_always_stops(fake_run: dict[str, Any]) -> None:
    fake_run["broken"] = {"node": {"cp-01"}}
    with pytest.raises(PhaseFailed) as err:
        fake_run["run"](max_fail="50%")
    assert err.value.phase == "node"
