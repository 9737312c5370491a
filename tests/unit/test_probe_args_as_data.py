"""Security review 2, L1: the fact probes print the paths and names they are given as data.
A registry mirror host with ``$(...)`` once became a command run as root on every node by the
Files probe (``echo "F {path} ..."``), in ``invoke plan`` too. These tests run the real probe
lines with a real ``sh`` in a temporary folder, with the hostile path really there."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from gpuk8s.facts.system import Files, FileState, KernelModules, Services, Sysctls

MARK = "PWNED"


def _sh(script: str, cwd: Path, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"PATH": path} if path else {})}
    return subprocess.run(["sh", "-c", script], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=60, check=False)


# --------------------------------------------------------------------------- L1: probes


@pytest.mark.parametrize("name", [
    "$(touch PWNED)x.lab_5000.crt",        # the review's registry host
    "`touch PWNED`.crt",                   # backquotes
    "'$(touch PWNED)'.crt",                # a quote ends the old 'N ...' string
    '"; touch PWNED; echo ".crt',          # a double quote ends the old "F ..." string
])
def test_the_files_probe_prints_a_hostile_path_as_data(tmp_path: Path, name: str) -> None:
    there = tmp_path / "certs.d"
    there.mkdir()
    present = there / name
    present.write_bytes(b"ca\n")
    missing = str(there / ("missing-" + name))
    fact = Files("+" + str(present), missing)
    run = _sh(fact.command(), tmp_path)
    assert not (tmp_path / MARK).exists(), "the probe ran a path as a command"
    assert not (there / MARK).exists()
    states = fact.parse(run.stdout, run.returncode)
    assert states[str(present)].exists and states[str(present)].content == b"ca\n"
    assert states[str(present)].mode == format(stat.S_IMODE(present.stat().st_mode), "o")
    assert states[missing] == FileState(missing, False)


def test_the_other_probes_take_their_names_as_data(tmp_path: Path) -> None:
    hostile = "$(touch${IFS}PWNED)"
    for fact in (Sysctls(hostile, "kernel.x;touch PWNED"), Services(hostile, "a`touch PWNED`"),
                 KernelModules(hostile, "'; touch PWNED; '")):
        assert _sh(fact.command(), tmp_path).returncode == 0, fact
        assert not (tmp_path / MARK).exists(), fact
    units = Services(hostile).parse(_sh(Services(hostile).command(), tmp_path).stdout, 0)
    assert list(units) == [hostile]  # the line names the unit as given
    modules = KernelModules(hostile).parse(_sh(KernelModules(hostile).command(),
                                               tmp_path).stdout, 0)
    assert modules == {hostile: False}
