"""The NVIDIA packages' stand-in scripts as the package builder renders them: DKMS needs headers,
the driver's install, reboot and upgrade cycle, exact-version meta packages, the fabric manager,
the CUDA toolkits, and every file marked as a stand-in."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.lab import debs
from tests.lab.selftest.standins.nvidia_helpers import (
    NEW,
    OLD,
    SINGLE,
    _defs,
    fake_pci,
    install_files,
    load_module,
    run,
    smi,
)

STUBS = {
    "deb-systemd-helper": "exit 0",
    "deb-systemd-invoke": "exit 0",
    "systemctl": "exit 0",
    "update-alternatives": 'echo "update-alternatives $*" >> "$GPUK8S_LAB_ROOT/ua.log"',
}


def run_script(
    root: Path, spec: debs.BuildSpec, name: str, *args: str, krel: str = "6.1.0-lab"
) -> subprocess.CompletedProcess[str]:
    stubs = root.parent / "stubs"
    stubs.mkdir(exist_ok=True)
    for cmd, body in STUBS.items():
        (stubs / cmd).write_text(f"#!/bin/sh\n{body}\n")
        (stubs / cmd).chmod(0o755)
    script = root.parent / f"{spec.name}.{name}"
    script.write_text(spec.scripts[name])
    script.chmod(0o755)
    env = dict(
        os.environ,
        GPUK8S_LAB_ROOT=str(root),
        GPUK8S_LAB_KREL=krel,
        PATH=f"{stubs}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    )
    return subprocess.run([str(script), *args], capture_output=True, text=True, env=env)


def boot(root: Path) -> None:
    """A reboot: /run is empty again, then nvidia-lab-modload.service runs."""
    import shutil

    shutil.rmtree(root / "run", ignore_errors=True)
    (root / "run").mkdir()
    res = run(root, "/usr/lib/gpuk8s-lab/nvidia/nvidia-lab-modload")
    assert res.returncode == 0, res.stderr


def test_dkms_standin_needs_headers(root: Path) -> None:
    spec = install_files(root, "nvidia-kernel-open-dkms", NEW)
    res = run_script(root, spec, "postinst", "configure", "")
    assert res.returncode != 0
    assert (
        "Error! Your kernel headers for kernel 6.1.0-lab cannot be found at "
        "/lib/modules/6.1.0-lab/build" in res.stderr
    )
    assert not (root / "usr/lib/gpuk8s-lab/nvidia/module-version").exists()


def test_driver_install_reboot_upgrade_cycle(root: Path) -> None:
    fake_pci(root, (SINGLE / "sys-pci-nvidia.txt").read_text().splitlines())
    (root / "usr/src/linux-headers-6.1.0-lab").mkdir(parents=True)
    # first install: 580.105.08 open
    mod = install_files(root, "nvidia-kernel-open-dkms", OLD)
    install_files(root, "nvidia-driver-cuda", OLD)
    res = run_script(root, mod, "postinst", "configure", "")
    assert res.returncode == 0, res.stderr
    assert (root / "var/run/reboot-required").read_text() == "*** System restart required ***\n"
    assert (root / "var/run/reboot-required.pkgs").read_text() == "nvidia-kernel-open-dkms\n"
    assert (
        "Open Kernel Module for x86_64  580.105.08  Release Build"
        in (root / "usr/lib/gpuk8s-lab/nvidia/proc-driver-nvidia-version").read_text()
    )
    assert "nvidia-lab-modload.service" in mod.scripts["postinst"]
    assert smi(root).returncode == 9  # not loaded before the reboot
    boot(root)
    assert smi(root).returncode == 0
    assert (
        smi(root, "--query-gpu=driver_version,persistence_mode", "--format=csv,noheader").stdout
        == "580.105.08, Enabled\n"
    )
    # upgrade to 580.159.04: userspace new, module old until the next boot
    mod = install_files(root, "nvidia-kernel-open-dkms", NEW)
    install_files(root, "nvidia-driver-cuda", NEW)
    assert run_script(root, mod, "postinst", "configure", OLD).returncode == 0
    assert (root / "var/run/reboot-required.pkgs").read_text() == "nvidia-kernel-open-dkms\n"
    res = smi(root)
    assert res.returncode == 18 and "NVML library version: 580.159" in res.stdout
    boot(root)
    assert smi(root, "--query-gpu=driver_version", "--format=csv,noheader").stdout == "580.159.04\n"
    # proprietary flavour
    prop = install_files(root, "nvidia-kernel-dkms", NEW)
    assert run_script(root, prop, "postinst", "configure", "").returncode == 0
    assert (
        "NVIDIA UNIX x86_64 Kernel Module  580.159.04"
        in (root / "usr/lib/gpuk8s-lab/nvidia/proc-driver-nvidia-version").read_text()
    )


def test_meta_packages_pin_exact_versions() -> None:
    d = _defs()
    for version in (OLD, NEW):
        open_ = debs.render(d["nvidia-open-580"], version).control
        prop = debs.render(d["cuda-drivers-580"], version).control
        assert (
            f"Depends: nvidia-kernel-open-dkms (= {version}), nvidia-driver-cuda (= {version})"
            in open_
        )
        assert (
            f"Depends: nvidia-kernel-dkms (= {version}), nvidia-driver-cuda (= {version})" in prop
        )
    for name in ("nvidia-container-toolkit", "libnvidia-container-tools"):
        ctl = debs.render(d[name], "1.19.0-1").control
        assert "(= 1.19.0-1)" in ctl and "1.20.0" not in ctl


def test_fabricmanager(root: Path) -> None:
    install_files(root, "nvidia-fabricmanager", NEW)
    fake_pci(root, (SINGLE / "sys-pci-nvidia.txt").read_text().splitlines())
    env = {"GPUK8S_LAB_FM_ONESHOT": "1"}
    res = run(root, "/usr/bin/nv-fabricmanager", env=env)
    assert res.returncode == 1 and "don't match with driver version N/A" in res.stderr
    load_module(root, OLD)
    res = run(root, "/usr/bin/nv-fabricmanager", env=env)
    assert (
        res.returncode == 1
        and "interface version 580.159.04 don't match with driver version 580.105.08" in res.stderr
    )
    load_module(root, NEW)
    res = run(root, "/usr/bin/nv-fabricmanager", env=env)
    assert res.returncode == 1 and "NV_WARN_NOTHING_TO_DO" in res.stderr
    fake_pci(root, ["0000:c0:00.0 0x10de 0x22a3 0x068000 0x10de 0x1796 -"])
    res = run(root, "/usr/bin/nv-fabricmanager", env=env)
    assert res.returncode == 0, res.stderr
    assert (
        run(root, "/usr/bin/nv-fabricmanager", "--version").stdout
        == "Fabric Manager version is : 580.159.04\n"
    )


def test_cuda_toolkits(root: Path) -> None:
    spec = install_files(root, "cuda-toolkit-13-0", "13.0.2-1")
    res = run(root, "/usr/local/cuda-13.0/bin/nvcc", "--version")
    assert res.stdout.splitlines()[0] == "nvcc: NVIDIA (R) Cuda compiler driver"
    assert "Cuda compilation tools, release 13.0, V13.0.88" in res.stdout.splitlines()
    assert res.stdout.splitlines()[-1] == "Build cuda_13.0.r13.0/compiler.36424714_0"
    info = json.loads((root / "usr/local/cuda-13.0/version.json").read_text())
    assert info["cuda"] == {"name": "CUDA SDK", "version": "13.0.2"}
    assert run_script(root, spec, "postinst", "configure", "").returncode == 0
    assert (
        "--install /usr/local/cuda cuda /usr/local/cuda-13.0 130" in (root / "ua.log").read_text()
    )
    install_files(root, "cuda-toolkit-12-8", "12.8.1-1")
    res = run(root, "/usr/local/cuda-12.8/bin/nvcc", "--version")
    assert "Cuda compilation tools, release 12.8, V12.8.93" in res.stdout


def test_every_file_is_marked() -> None:
    here = Path(__file__).resolve().parents[2] / "standins" / "nvidia"
    for f in here.iterdir():
        if f.suffix in (".json",):
            continue
        head = f.read_text().split("\n")[:3]
        assert any(
            "LAB STAND-IN: not the real" in ln or "LAB STAND-IN: not a real" in ln for ln in head
        ), f
