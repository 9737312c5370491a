"""One project root (issue 31): roles/, templates/ and the variables' defaults all come from
$GPUK8S_HOME, else from the checkout gpuk8s is imported from; a GPUK8S_HOME that is not a
gpuk8s checkout, or a wheel installed apart from its checkout with no GPUK8S_HOME, is one
clear error."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from gpuk8s import bundle as b
from gpuk8s import cli
from gpuk8s.errors import Gpuk8sError
from gpuk8s.variables import load_variable_specs
from tests.unit.installs import bare_venv, build_wheel, no_index, sh, wheel_cache

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "inventories" / "lab.yaml"

# What the installed gpuk8s reads, printed as JSON: where it was imported from, its variable
# specs, and the lab inventory as `check` loads it (problems; warnings, where "ignored" ones go)
PROBE = """
import json, sys
import gpuk8s
from gpuk8s.inventory.builder import inspect_inventory
from gpuk8s.variables import load_variable_specs
inv, problems, notes = inspect_inventory(sys.argv[1])
print(json.dumps({"file": gpuk8s.__file__, "specs": sorted(load_variable_specs()),
                  "problems": [str(p) for p in problems],
                  "warnings": list(inv.warnings) if inv else None}))
"""


def test_an_installed_wheel_reads_everything_from_gpuk8s_home(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    start = time.monotonic()
    cache = wheel_cache(b.project(ROOT)["requirements"])
    no_index(monkeypatch)
    monkeypatch.delenv("PYTHONPATH", raising=False)  # nothing of the checkout on the path
    monkeypatch.delenv("GPUK8S_HOME", raising=False)
    wheel = build_wheel(ROOT, tmp_path / "dist", cache)
    venv = tmp_path / "venv"
    python = bare_venv(venv, cache, str(wheel))
    elsewhere = tmp_path / "elsewhere"  # the cwd: outside the checkout
    elsewhere.mkdir()

    seen = json.loads(sh([str(python), "-c", PROBE, str(LAB)], elsewhere,
                         GPUK8S_HOME=str(ROOT)).splitlines()[-1])
    assert Path(seen["file"]).is_relative_to(venv), seen["file"]  # the wheel, not the checkout
    checkout = sorted(load_variable_specs(ROOT))
    assert len(checkout) > 60
    assert seen["specs"] == checkout, \
        f"{len(seen['specs'])} of the checkout's {len(checkout)} variable specs"
    assert seen["problems"] == []
    assert seen["warnings"] is not None
    assert not [w for w in seen["warnings"] if "ignored" in w], seen["warnings"]

    out = sh([str(venv / "bin" / "gpuk8s"), "check", "-i", str(LAB)], elsewhere,
             GPUK8S_HOME=str(ROOT))
    assert "no problems" in out and "ignored" not in out, out
    assert re.search(r"kubernetes_version = \S+", out), out

    # no GPUK8S_HOME: the wheel's folder is no checkout, and gpuk8s says so
    proc = subprocess.run([str(venv / "bin" / "gpuk8s"), "check", "-i", str(LAB)],
                          cwd=elsewhere, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "GPUK8S_HOME" in proc.stderr, proc.stderr
    assert time.monotonic() - start < 60


def test_gpuk8s_home_that_is_no_checkout_is_one_clear_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "not-gpuk8s"
    (home / "roles").mkdir(parents=True)  # roles/ alone: templates/ and the defaults missing
    monkeypatch.setenv("GPUK8S_HOME", str(home))
    with pytest.raises(Gpuk8sError) as exc:
        load_variable_specs()
    text = str(exc.value)
    assert "GPUK8S_HOME" in text and str(home) in text
    assert "templates/" in text and "gpuk8s/defaults.yaml" in text
    assert "roles/" not in text.split("fix:")[0].split("has no")[-1]  # only what is missing
    assert "fix:" in text
    assert cli.run("check", inventory=str(LAB), sets=[]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: GPUK8S_HOME=") and err.count("error:") == 1, err


def test_the_root_is_gpuk8s_home_else_the_checkout(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuk8s.paths import project_root

    monkeypatch.delenv("GPUK8S_HOME", raising=False)
    assert project_root() == ROOT
    monkeypatch.setenv("GPUK8S_HOME", "")  # empty: not set
    assert project_root() == ROOT
    monkeypatch.chdir(ROOT.parent)
    monkeypatch.setenv("GPUK8S_HOME", ROOT.name)  # relative: to the cwd
    assert project_root() == ROOT


CLIMB = re.compile(r"__file__\W*\)?(\.resolve\(\))?\.(parent\.parent|parents\[)")
READ_HOME = re.compile(r"environ\W*(get\W*)?[\"']GPUK8S_HOME")


def test_only_gpuk8s_paths_finds_the_root() -> None:
    """Every reader of roles/, templates/ and the defaults goes through gpuk8s.paths: no other
    module reads GPUK8S_HOME or climbs out of the package from its __file__."""
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in [*sorted((ROOT / "gpuk8s").rglob("*.py")), ROOT / "tasks.py"]
             if path != ROOT / "gpuk8s" / "paths.py"
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if CLIMB.search(line) or READ_HOME.search(line)]
    assert found == []
