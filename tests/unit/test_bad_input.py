"""Bad input stops a run before any host is contacted: every broken inventory (bootstrap,
plan, facts) and broken workload values files (deploy) fail with our error, and the opener
(the only way to reach a host) is never called."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import api, workloads
from gpuk8s.errors import InventoryError
from gpuk8s.redact import Redactor
from gpuk8s.report import Reporter
from gpuk8s.transport import ConnectSpec
from tests.unit.test_inventory import GOOD, _bad_cases

VALUES_BAD = Path(__file__).parent / "fixtures" / "values" / "bad"


def no_host(spec: ConnectSpec, redact: Redactor) -> Any:
    pytest.fail(f"{spec.name} was contacted for a broken input")


@pytest.fixture(autouse=True)
def _runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUK8S_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("GPUK8S_BECOME_PASSWORD", raising=False)


@pytest.mark.parametrize("path", _bad_cases(), ids=lambda p: p.parent.name + "/" + p.name)
@pytest.mark.parametrize("command", ["bootstrap", "plan"])
def test_broken_inventory_contacts_no_host(path: Path, command: str) -> None:
    fn = api.bootstrap if command == "bootstrap" else api.plan
    kwargs: dict[str, Any] = {"yes": True} if command == "bootstrap" else {}
    with pytest.raises(InventoryError) as err:
        fn(path, reporter=Reporter(io.StringIO()), opener=no_host, **kwargs)
    assert err.value.path and err.value.fix, str(err.value)


def test_facts_on_a_broken_inventory_contacts_no_host(monkeypatch: pytest.MonkeyPatch) -> None:
    # facts() takes no opener: connecting at all (open_all) fails the test
    import gpuk8s.session as session_mod

    monkeypatch.setattr(session_mod, "open_all", lambda *a, **k: pytest.fail("connected"))
    for path in _bad_cases():
        with pytest.raises(InventoryError):
            api.facts(path, reporter=Reporter(io.StringIO()))


def values_cases() -> list[Path]:
    return sorted(VALUES_BAD.iterdir())


def test_there_are_broken_values_files() -> None:
    assert len(values_cases()) >= 6


@pytest.mark.parametrize("path", values_cases(), ids=lambda p: p.name)
def test_broken_values_file_contacts_no_host(path: Path) -> None:
    with pytest.raises(workloads.WorkloadError) as err:
        workloads.deploy(GOOD / "lab" / "hosts.yaml", "jupyter", values_files=[str(path)],
                         reporter=Reporter(io.StringIO()), opener=no_host)
    assert str(path) in str(err.value) or path.name in str(err.value), str(err.value)
