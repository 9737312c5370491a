"""What the NVIDIA stand-ins' tests share: the real H200 captures, package files rendered by the
package builder and unpacked under a fake root, fake PCI devices, running a stand-in there. Their
fixtures (root, dual) are in conftest.py.

The stand-ins prefix every absolute path with $GPUK8S_LAB_ROOT, so they run here on the host
against a fake /sys/bus/pci/devices built from the real H200 fixtures. Scripts are rendered by the
package builder (so @UPSTREAM_VERSION@ etc. are substituted exactly as in the .debs).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.lab import debs
from tests.lab.paths import REPO_ROOT

#: real captures from H200 hosts, kept in the repository
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "nvidia"
DUAL = FIXTURES / "2xh200-ubuntu2404"
SINGLE = FIXTURES / "h200-ubuntu2404"
NEW, OLD = "580.159.04-1", "580.105.08-1"


def _defs() -> dict[str, debs.PackageDef]:
    return {
        str(d.raw["name"]): d for d in debs.load_definitions() if d.repo != "docker/debian/bookworm"
    }


def install_files(root: Path, package: str, version: str) -> debs.BuildSpec:
    """Render package=version with the builder and unpack its files under root (no scripts run)."""
    spec = debs.render(_defs()[package], version)
    for e in spec.entries:
        target = root / e.dest.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if e.link is not None:
            if target.is_symlink():
                target.unlink()
            target.symlink_to(e.link)
        else:
            target.write_bytes(e.data or b"")
            target.chmod(e.mode)
    return spec


def fake_pci(root: Path, lines: list[str]) -> None:
    """lines in the fixtures' sys-pci-nvidia.txt format:
    NAME VENDOR DEVICE CLASS SUBVEN SUBDEV DRIVER."""
    for line in lines:
        name, vendor, device, cls, subven, subdev, *_ = line.split()
        d = root / "sys/bus/pci/devices" / name
        d.mkdir(parents=True, exist_ok=True)
        for k, v in dict(
            vendor=vendor,
            device=device,
            class_=cls,
            subsystem_vendor=subven,
            subsystem_device=subdev,
            numa_node="0",
        ).items():
            (d / k.rstrip("_")).write_text(v + "\n")


def run(
    root: Path, *cmd: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ, GPUK8S_LAB_ROOT=str(root), LC_ALL="C")
    e.update(env or {})
    exe = str(root / cmd[0].lstrip("/"))
    return subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, env=e)


def smi(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run(root, "/usr/bin/nvidia-smi", *args)


def load_module(root: Path, version: str, persistence: bool = True) -> None:
    run_dir = root / "run/nvidia-lab"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "loaded-module-version").write_text(debs.upstream_version(version) + "\n")
    if persistence:
        (run_dir / "persistence-mode").write_text("Enabled\n")
