"""The lab's nvidia-smi stand-in against the REAL MIG outputs of an H200.

tests/fixtures/nvidia/h200-mig/ holds what nvidia-smi printed on a real H200 (driver 580) for
one MIG cycle (its README lists the commands, in order). The stand-in, rendered by the lab's
package builder and run against a fake root with that host's GPU
(tests/fixtures/nvidia/h200-ubuntu2404), must print the same bytes, step by step. Only the GPU
UUID differs: the lab derives it from the node's machine-id."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.lab.selftest.standins.nvidia_helpers import (
    NEW,
    SINGLE,
    fake_pci,
    install_files,
    load_module,
)

MIG = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia" / "h200-mig"
UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

#: the capture's README, in its order: (fixture, nvidia-smi arguments); every exit code is 0
SEQUENCE = [
    ("lgip.txt", ["mig", "-lgip"]),
    ("lgipp.txt", ["mig", "-lgipp"]),
    ("lgi-disabled.txt", ["mig", "-lgi"]),
    ("mig-enable.txt", ["-i", "0", "-mig", "1"]),
    ("cgi.txt", ["mig", "-cgi", "9"]),
    ("lgi-one-3g.txt", ["mig", "-lgi"]),
    ("L-gi-without-ci.txt", ["-L"]),
    ("dci-none.txt", ["mig", "-dci"]),
    ("dgi.txt", ["mig", "-dgi"]),
    ("mig-disable.txt", ["-i", "0", "-mig", "0"]),
]


@pytest.fixture
def h200(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/machine-id").write_text("5f1c0c7e4a8b4d0f9e6b2a1c3d4e5f60\n")
    fake_pci(root, (SINGLE / "sys-pci-nvidia.txt").read_text().splitlines())
    install_files(root, "nvidia-driver-cuda", NEW)
    load_module(root, NEW)
    return root


def smi(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, GPUK8S_LAB_ROOT=str(root), LC_ALL="C")
    env.pop("GPUK8S_LAB_VISIBLE_GPUS", None)
    return subprocess.run([str(root / "usr/bin/nvidia-smi"), *args], capture_output=True,
                          text=True, env=env)


def test_readme_lists_the_sequence() -> None:
    readme = (MIG / "README.md").read_text()
    rows = re.findall(r"^\| (\S+\.txt) \| `nvidia-smi ([^`]*)`.* \| (\d+) \|$", readme, re.M)
    assert [(f, a.split()[:6]) for f, a, _ in rows] == [(f, a) for f, a in SEQUENCE]
    assert {rc for _, _, rc in rows} == {"0"}


def test_the_h200_mig_cycle_matches_the_real_outputs(h200: Path) -> None:
    for fixture, args in SEQUENCE:
        res = smi(h200, *args)
        want = (MIG / fixture).read_text()
        got = res.stdout
        if fixture.startswith("L-"):
            got, want = UUID.sub("GPU-UUID", got), UUID.sub("GPU-UUID", want)
        assert (res.returncode, got, res.stderr) == (0, want, ""), f"nvidia-smi {' '.join(args)}"
    # MIG mode off again, no instance left: nothing to remember
    assert json.loads((h200 / "var/lib/gpuk8s-lab/nvidia/mig.json").read_text()) == {}


def test_state_file_after_cgi(h200: Path) -> None:
    assert smi(h200, "-i", "0", "-mig", "1").returncode == 0
    assert smi(h200, "mig", "-cgi", "9").returncode == 0
    state = json.loads((h200 / "var/lib/gpuk8s-lab/nvidia/mig.json").read_text())
    assert state == {"0000:00:06.0": {"mode": "Enabled", "gis": [
        {"id": 2, "profile": 9, "start": 4, "size": 4, "cis": []}]}}
    assert not list((h200 / "var/lib/gpuk8s-lab/nvidia").glob("*.tmp"))
