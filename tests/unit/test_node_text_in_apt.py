"""Security review 2, shell building sweep: node text reaches apt's commands as data. The
running kernel's release names linux-headers-<kernel> in ``apt-mark hold``, and the installed
driver's version becomes the fabric manager's version prefix, printed when apt has no such
version. The rendered commands run in a real ``sh`` against stand-in apt tools that record
their argv."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpuk8s.facts.system import PackageState
from gpuk8s.ops import apt
from tests.unit.scenarios import default_vars

MARK = "PWNED"


def _sh(script: str, cwd: Path, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"PATH": path} if path else {})}
    return subprocess.run(["sh", "-c", script], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=60, check=False)


# --------------------------------------------------------------------------- node text in sh


def _stand_ins(tmp_path: Path) -> tuple[str, Path]:
    """A PATH whose apt tools record their argv (one file per call) and answer nothing."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    calls = tmp_path / "calls"
    calls.mkdir()
    for tool in ("apt-mark", "apt-get", "apt-cache"):
        script = bin_ / tool
        script.write_text(f'#!/bin/sh\nf=$(mktemp {calls}/{tool}.XXXXXX)\n'
                          'for a in "$@"; do printf "%s\\n" "$a"; done > "$f"\nexit 0\n')
        script.chmod(0o755)
    return f"{bin_}:{os.environ['PATH']}", calls


def test_a_hostile_kernel_release_is_one_word_of_apt_mark_hold(tmp_path: Path) -> None:
    """linux-headers-<uname -r>: the running kernel's name is node text."""
    from roles.nvidia_driver import role as driver

    os_ = {"ID": "ubuntu", "VERSION_ID": "24.04"}
    vars = default_vars()
    kernel = "6.8.0$(touch PWNED)"
    wanted = driver.driver_packages(vars, os_, (), kernel, headers_installed=False)
    installed = {n: PackageState(p + "1-0", False, "ii") for n, p in wanted.items()}
    op = apt.packages(installed, "x", wanted, hold=True)  # installed, only the hold is new
    path, calls = _stand_ins(tmp_path)
    run = _sh("\n".join(op.commands), tmp_path, path)
    assert run.returncode == 0, run.stderr
    assert not (tmp_path / MARK).exists()
    [hold] = [p for p in calls.iterdir() if p.name.startswith("apt-mark")]
    assert hold.read_text().splitlines() == ["hold", *wanted]
    assert f"linux-headers-{kernel}" in wanted


def test_a_hostile_installed_version_is_data_in_the_no_version_error(tmp_path: Path) -> None:
    """The fabric manager's version prefix comes from the installed driver (dpkg on the node);
    when apt has no such version, the error names it, as text."""
    prefix = '580.$(touch PWNED)"`touch PWNED`'
    op = apt.packages({}, "x", {"nvidia-fabricmanager": prefix}, hold=True)
    path, _ = _stand_ins(tmp_path)
    run = _sh("\n".join(op.commands), tmp_path, path)
    assert not (tmp_path / MARK).exists()
    assert run.returncode == 100
    assert (f'no nvidia-fabricmanager version matching "{prefix}" in the configured apt '
            "sources") in run.stderr
