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


def boot(root: Path, krel: str = "6.1.0-lab") -> None:
    """A reboot into kernel ``krel``: /run is empty again, then nvidia-lab-modload.service
    runs."""
    import shutil

    shutil.rmtree(root / "run", ignore_errors=True)
    (root / "run").mkdir()
    res = run(root, "/usr/lib/gpuk8s-lab/nvidia/nvidia-lab-modload",
              env={"GPUK8S_LAB_KREL": krel})
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


def test_dkms_standin_builds_per_kernel_and_from_the_kernel_hooks(root: Path) -> None:
    """A module per kernel, where DKMS installs it and readable by the real modinfo format
    (.modinfo in an ELF object); a kernel installed later gets one from the hook; a kernel
    the module does not build against keeps none, and the failed build's log stays where
    DKMS leaves it (build/make.log)."""
    (root / "usr/src/linux-headers-6.1.0-lab").mkdir(parents=True)
    mod = install_files(root, "nvidia-kernel-open-dkms", NEW)
    res = run_script(root, mod, "postinst", "configure", "")
    assert res.returncode == 0, res.stderr
    ko = root / "lib/modules/6.1.0-lab/updates/dkms/nvidia.ko"
    data = ko.read_bytes()
    assert data[:4] == b"\x7fELF" and b"version=580.159.04\0" in data
    hook = root / "etc/kernel/postinst.d/dkms"
    assert hook.read_bytes() == (root / "etc/kernel/header_postinst.d/dkms").read_bytes()
    # a new kernel with headers: its module is built when the kernel is installed
    (root / "usr/src/linux-headers-6.1.0-lab2").mkdir(parents=True)
    (root / "usr/src/linux-headers-6.1.0-lab2/Makefile").write_text("KERNELRELEASE = x\n")
    res = run(root, "/etc/kernel/postinst.d/dkms", "6.1.0-lab2", "/boot/vmlinuz-6.1.0-lab2")
    assert res.returncode == 0, res.stderr
    assert b"version=580.159.04\0" in \
        (root / "lib/modules/6.1.0-lab2/updates/dkms/nvidia.ko").read_bytes()
    # no headers: DKMS's hint, no module, the kernel's install goes on (exit 0); a failed
    # build fails the hook (exit 11), and so the kernel package's postinst
    res = run(root, "/etc/kernel/postinst.d/dkms", "6.1.0-lab4")
    assert res.returncode == 0 and "please install the linux-headers-6.1.0-lab4" in res.stdout
    assert not (root / "lib/modules/6.1.0-lab4").exists()
    # a kernel the driver does not build against
    (root / "usr/src/linux-headers-6.1.0-lab3").mkdir(parents=True)
    (root / "usr/src/linux-headers-6.1.0-lab3/Makefile").write_text(
        "KERNELRELEASE = 6.1.0-lab3\nGPUK8S_LAB_NVIDIA_BUILD = fail\n")
    res = run(root, "/etc/kernel/header_postinst.d/dkms", "6.1.0-lab3")
    assert res.returncode == 11 and "autoinstall for kernel: 6.1.0-lab3 failed!" in res.stdout
    assert "Bad return status for module build on kernel: 6.1.0-lab3 (x86_64)" in res.stderr
    assert not (root / "lib/modules/6.1.0-lab3/updates/dkms/nvidia.ko").exists()
    log = (root / "var/lib/dkms/nvidia/580.159.04/build/make.log").read_text()
    assert "Error 1" in log and "6.1.0-lab3" in log
    # booting a kernel loads the module built for it, or none
    install_files(root, "nvidia-driver-cuda", NEW)
    fake_pci(root, (SINGLE / "sys-pci-nvidia.txt").read_text().splitlines())
    boot(root, "6.1.0-lab3")
    assert smi(root).returncode == 9
    boot(root, "6.1.0-lab2")
    assert smi(root, "--query-gpu=driver_version", "--format=csv,noheader").stdout == \
        "580.159.04\n"
    # removing the package removes what it built, for every kernel
    assert run_script(root, mod, "postrm", "remove").returncode == 0
    assert not ko.exists() and not (root / "lib/modules/6.1.0-lab2/updates/dkms/nvidia.ko").exists()


def test_an_upgrade_between_a_kernels_headers_and_its_image_leaves_no_old_module(
        root: Path) -> None:
    """The order unattended-upgrades may take (its steps follow a Python set's order): the
    new kernel's headers, then the driver upgrade, then the kernel image. The headers' hook
    builds the old driver for the new kernel; the old package's prerm (dh_dkms: `dkms remove
    --all` on upgrade) takes it out again; the new postinst builds only for kernels with an
    image; the image's hook then builds the new driver. The new kernel never keeps the old
    module (CI of 2ddf3ba saw 580.159.04 on it before the prerm existed)."""
    (root / "usr/src/linux-headers-6.1.0-lab").mkdir(parents=True)
    old = install_files(root, "nvidia-kernel-open-dkms", NEW)
    assert run_script(root, old, "postinst", "configure", "").returncode == 0
    (root / "usr/src/linux-headers-6.1.0-lab2").mkdir(parents=True)
    assert run(root, "/etc/kernel/header_postinst.d/dkms", "6.1.0-lab2").returncode == 0
    ko2 = root / "lib/modules/6.1.0-lab2/updates/dkms/nvidia.ko"
    assert b"version=580.159.04\0" in ko2.read_bytes()

    res = run_script(root, old, "prerm", "upgrade", "580.173.02-1")
    assert res.returncode == 0, res.stderr
    assert not ko2.exists() and not (root / "lib/modules/6.1.0-lab/updates/dkms/nvidia.ko").exists()
    assert not (root / "var/lib/dkms/nvidia/580.159.04").exists()
    new = install_files(root, "nvidia-kernel-open-dkms", "580.173.02-1")
    assert run_script(root, new, "postinst", "configure", "580.159.04-1").returncode == 0
    assert b"version=580.173.02\0" in \
        (root / "lib/modules/6.1.0-lab/updates/dkms/nvidia.ko").read_bytes()
    assert not ko2.exists()          # no image for 6.1.0-lab2 yet
    (root / "boot").mkdir(exist_ok=True)
    (root / "boot/vmlinuz-6.1.0-lab2").write_text("image\n")
    assert run(root, "/etc/kernel/postinst.d/dkms", "6.1.0-lab2",
               "/boot/vmlinuz-6.1.0-lab2").returncode == 0
    assert b"version=580.173.02\0" in ko2.read_bytes()


def test_a_node_boots_its_newest_kernel_image(root: Path) -> None:
    """gpuk8s-lab-kernel-boot and the uname stand-in: the newest /boot/vmlinuz-* by version
    order is the kernel uname reports after a boot; none: the real uname's answer."""
    import shutil

    here = Path(__file__).resolve().parents[2] / "standins" / "kernel"
    for name in ("uname", "gpuk8s-lab-kernel-boot"):
        shutil.copy(here / name, root / name)
    real = subprocess.run(["uname", "-r"], capture_output=True, text=True).stdout.strip()
    assert run(root, "/uname", "-r").stdout.strip() == real
    (root / "boot").mkdir()
    for k in ("6.8.0-9-generic", "6.8.0-51-generic", "6.8.0-100-generic"):
        (root / f"boot/vmlinuz-{k}").write_text("x")
    res = run(root, "/gpuk8s-lab-kernel-boot")
    assert res.returncode == 0 and "booted 6.8.0-100-generic" in res.stdout
    assert run(root, "/uname", "-r").stdout == "6.8.0-100-generic\n"
    assert run(root, "/uname", "-sr").stdout.split() == ["Linux", "6.8.0-100-generic"]
    assert run(root, "/uname", "-a").stdout.split()[2] == "6.8.0-100-generic"
    assert run(root, "/uname", "-m").stdout.strip() == os.uname().machine


def test_a_driver_load_plays_udev_and_nvidias_rule_links_dev_char(root: Path) -> None:
    """NVIDIA's /dev/char rule (the one gpuk8s installs) fires when the module stand-in loads:
    nvidia-ctk's stand-in links every device node by MAJOR:MINOR; a second run only warns."""
    from roles.nvidia_container_toolkit.role import DEV_CHAR_RULE, DEV_CHAR_RULES

    fake_pci(root, (SINGLE / "sys-pci-nvidia.txt").read_text().splitlines())
    (root / "usr/src/linux-headers-6.1.0-lab").mkdir(parents=True)
    mod = install_files(root, "nvidia-kernel-open-dkms", NEW)
    assert run_script(root, mod, "postinst", "configure", "").returncode == 0
    install_files(root, "nvidia-container-toolkit-base", "1.20.0-1")
    rules = root / DEV_CHAR_RULES.lstrip("/")
    rules.parent.mkdir(parents=True)
    rules.write_text(DEV_CHAR_RULE)
    boot(root)
    links = {p.name: os.readlink(p) for p in (root / "dev/char").iterdir()}
    gpus = sum(1 for line in (SINGLE / "sys-pci-nvidia.txt").read_text().splitlines() if line)
    assert links["195:255"] == "/dev/nvidiactl" and links["195:254"] == "/dev/nvidia-modeset"
    assert links["510:0"] == "/dev/nvidia-uvm" and links["510:1"] == "/dev/nvidia-uvm-tools"
    assert links["195:0"] == "/dev/nvidia0" and len(links) >= 4 + 1, (links, gpus)
    res = run(root, "/usr/bin/nvidia-ctk", "system", "create-dev-char-symlinks", "--create-all")
    assert res.returncode == 0
    assert "WARN[0000] Could not create symlink: symlink /dev/nvidiactl /dev/char/195:255: " \
        "file exists" in res.stderr
    # without --create-all: the char devices that exist
    for p in (root / "dev/char").iterdir():
        p.unlink()
    res = run(root, "/usr/bin/nvidia-ctk", "system", "create-dev-char-symlinks")
    assert res.returncode == 0 and "Creating link /dev/char/195:0 => /dev/nvidia0" in res.stderr
    assert os.readlink(root / "dev/char/510:1") == "/dev/nvidia-uvm-tools"


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
