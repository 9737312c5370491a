"""gpu_node_lock and the kernel/driver facts: the plan (hold, unhold, no-op), the
unattended-upgrades blacklist read by the real apt-config and matched the way
unattended-upgrade 2.9.1 matches it, NVIDIA's /dev/char udev rule word for word, the facts
parsed from a real H200 host, and status's "reboot pending" from nvidia-smi's real mismatch
text."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpuk8s.day2.kernelstatus import kernel_lines, kernel_row
from gpuk8s.facts import HostFacts
from gpuk8s.facts.dpkg import PackageState
from gpuk8s.facts.kernel import (
    GpuKernel,
    GpuKernelState,
    InstalledKernel,
    LockedPackages,
    LockPackages,
    release_key,
)
from gpuk8s.facts.nvidia import Nvidia, NvidiaState
from gpuk8s.facts.system import Files
from gpuk8s.roles import HostContext, load_role
from roles.gpu_node_lock.role import UU_BLACKLIST, UU_CONF, uu_conf
from roles.nvidia_container_toolkit.role import DEV_CHAR_RULE, DEV_CHAR_RULES
from tests.unit.scenarios import default_vars, fresh_facts

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "h200-ubuntu2404" / \
    "kernel-2026-11-29" / "facts.txt"

#: NVIDIA's workaround rule, as the NOTICE issue NVIDIA/nvidia-container-toolkit#48 gives it
#: (first posted by NVIDIA in NVIDIA/nvidia-docker#1671), and the file it names
NVIDIA_RULE = ('ACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", '
               'RUN+="/usr/bin/nvidia-ctk system create-dev-char-symlinks --create-all"')
NVIDIA_RULE_FILE = "/lib/udev/rules.d/71-nvidia-dev-char.rules"
#: the flags `nvidia-ctk system create-dev-char-symlinks` has at the pinned v1.20.0
#: (cmd/nvidia-ctk/system/create-dev-char-symlinks/create-dev-char-symlinks.go@v1.20.0)
CTK_FLAGS_1_20 = {"--dev-char-path", "--driver-root", "--create-all", "--load-kernel-modules",
                  "--create-device-nodes", "--dry-run"}


def test_dev_char_rule_is_nvidias_word_for_word() -> None:
    assert DEV_CHAR_RULES == NVIDIA_RULE_FILE
    assert DEV_CHAR_RULE == NVIDIA_RULE + "\n"
    flags = set(re.findall(r"--[a-z-]+", DEV_CHAR_RULE))
    assert flags <= CTK_FLAGS_1_20, flags - CTK_FLAGS_1_20


# -- unattended-upgrades ------------------------------------------------------------------------
def blacklisted(name: str, entries: tuple[str, ...] = UU_BLACKLIST) -> bool:
    """unattended-upgrade@2.9.1 is_pkgname_in_blacklist: re.match of each entry."""
    return any(re.match(e, name) for e in entries)


@pytest.mark.parametrize("name", [
    "linux-image-6.8.0-51-generic", "linux-image-generic", "linux-generic-hwe-24.04",
    "linux-modules-6.8.0-51-generic", "linux-modules-extra-6.8.0-51-generic",
    "linux-modules-nvidia-580-server-open-generic",
    "linux-modules-nvidia-580-server-open-6.8.0-51-generic", "linux-headers-6.1.0-28-amd64",
    "linux-image-amd64", "nvidia-driver-580-server-open", "nvidia-kernel-common-580-server",
    "libnvidia-compute-580-server", "nvidia-utils-580-server", "nvidia-open-580",
    "nvidia-kernel-open-dkms", "cuda-drivers-580", "libcuda1", "cuda-toolkit-13-0",
    "xserver-xorg-video-nvidia-580-server"])
def test_unattended_upgrades_leave_kernel_and_driver_packages(name: str) -> None:
    assert blacklisted(name)


@pytest.mark.parametrize("name", ["openssl", "libssl3", "python3-yaml", "containerd.io",
                                  "kubelet", "tzdata", "openssh-server", "systemd",
                                  "libcurl4", "gpuk8s-lab-motd"])
def test_unattended_upgrades_keep_every_other_update(name: str) -> None:
    assert not blacklisted(name)


def test_nvidia_alone_would_miss_the_libraries() -> None:
    """Why libnvidia- has its own entry: the match is anchored at the name's start."""
    assert not blacklisted("libnvidia-compute-580", ("nvidia-",))


@pytest.mark.skipif(shutil.which("apt-config") is None, reason="needs apt (Debian/Ubuntu)")
def test_the_blacklist_file_is_apt_conf_that_apt_reads_and_appends(tmp_path: Path) -> None:
    """The real apt-config parses it, and a list in a later file adds to an earlier one's."""
    admin = tmp_path / "50unattended-upgrades"
    admin.write_text('Unattended-Upgrade::Package-Blacklist { "my-own-pin"; };\n')
    ours = tmp_path / UU_CONF.rsplit("/", 1)[1]
    ours.write_bytes(uu_conf())
    out = subprocess.run(["apt-config", "-c", str(admin), "-c", str(ours), "dump",
                          "Unattended-Upgrade::Package-Blacklist"], capture_output=True,
                         text=True, check=True).stdout
    got = re.findall(r'Package-Blacklist:: "([^"]*)";', out)
    assert got == ["my-own-pin", *UU_BLACKLIST], out


# -- the role's plan ----------------------------------------------------------------------------
def ctx(packages: dict[str, tuple[str, bool]], *, lock: bool = True, conf: bool = False,
        waiting: dict[str, str] | None = None, gpus: int = 2) -> HostContext:
    vars = default_vars(gpu_node_lock=lock)
    facts = dict(fresh_facts("ubuntu2404", gpus, "gpu-01", vars).items())
    facts[LockPackages()] = LockedPackages(
        {n: PackageState(v, held, "hi" if held else "ii") for n, (v, held) in packages.items()},
        waiting or {})
    if conf:
        from gpuk8s.facts.system import FileState
        from gpuk8s.ops import sha256
        facts[Files(UU_CONF)] = {UU_CONF: FileState(UU_CONF, True, "644", "root",
                                                    sha256(uu_conf()))}
    return HostContext("gpu-01", "gpu_node_lock", vars, HostFacts("gpu-01", facts), {},
                       ("workers",))


NOBLE = {"linux-image-6.8.0-51-generic": ("6.8.0-51.52", False),
         "linux-image-generic": ("6.8.0-51.52", False),
         "nvidia-driver-580-server-open": ("580.95.05-0ubuntu0.24.04.2", True),
         "libnvidia-compute-580-server": ("580.95.05-0ubuntu0.24.04.2", False)}


def plan(c: HostContext) -> list[Any]:
    return load_role("gpu_node_lock").plan(c)


def test_a_gpu_node_gets_its_kernel_and_driver_held_and_the_blacklist() -> None:
    hold, conf = plan(ctx(NOBLE))
    assert hold.changes and "linux-image-generic" in hold.reason and \
        "libnvidia-compute-580-server" in hold.reason and \
        "nvidia-driver-580-server-open" not in hold.reason  # already held
    assert "kernel 6.8.0-51-generic and driver 580.95.05 locked together" in hold.reason
    assert "apt-mark hold" in hold.commands[0] and "nvidia-container" in hold.commands[0]
    assert conf.changes and UU_CONF in conf.reason


def test_a_locked_node_is_a_no_op_that_names_what_waits() -> None:
    held = {n: (v, True) for n, (v, _) in NOBLE.items()}
    hold, conf = plan(ctx(held, conf=True, waiting={"linux-image-generic": "6.8.0-60.63"}))
    assert not hold.changes and not conf.changes
    assert "held together (2 kernel, 2 driver packages)" in hold.reason
    assert "waiting: linux-image-generic 6.8.0-60.63" in hold.reason


def test_opting_out_unholds_and_removes_the_blacklist() -> None:
    held = {n: (v, True) for n, (v, _) in NOBLE.items()}
    unhold, conf = plan(ctx(held, lock=False, conf=True))
    assert unhold.changes and unhold.reason.startswith("- unhold ")
    assert "apt-mark unhold" in unhold.commands[0]
    assert conf.changes and conf.reason == f"- remove {UU_CONF}"
    none_held, _ = plan(ctx({n: (v, False) for n, (v, _) in NOBLE.items()}, lock=False))
    assert not none_held.changes


def test_cpu_nodes_and_fresh_gpu_nodes() -> None:
    assert plan(ctx({}, gpus=0)) == []
    hold, _ = plan(ctx({}))  # the node phase has not installed the driver yet
    assert hold.changes and "once the node phase has installed them" in hold.reason


# -- facts ----------------------------------------------------------------------------------------
def test_lock_packages_parse_leaves_the_toolkit_to_its_role() -> None:
    out = ("P linux-image-6.8.0-51-generic 6.8.0-51.52 hi hold ok installed\n"
           "P nvidia-container-toolkit 1.20.0-1 hi hold ok installed\n"
           "P libnvidia-container1 1.20.0-1 hi hold ok installed\n"
           "P libnvidia-compute-580-server 580.95.05-0ubuntu0.24.04.2 ii install ok installed\n"
           "C linux-image-6.8.0-51-generic 6.8.0-51.52\n"
           "C libnvidia-compute-580-server 580.126.09-0ubuntu0.24.04.1\n"
           "C nvidia-container-toolkit 1.21.0-1\n")
    got = LockPackages().parse(out, 0)
    assert sorted(got.installed) == ["libnvidia-compute-580-server",
                                     "linux-image-6.8.0-51-generic"]
    assert got.held == ["linux-image-6.8.0-51-generic"]
    assert got.unheld == ["libnvidia-compute-580-server"]
    assert got.waiting == {"libnvidia-compute-580-server": "580.126.09-0ubuntu0.24.04.1"}


def flat(lines: list[tuple[str, str]]) -> str:
    """status's lines as one text, the wrapping undone (within 80 columns each)."""
    assert all(len(t) <= 80 or " " not in t.strip() for t, _ in lines), lines
    return re.sub(r"\s+", " ", " ".join(t for t, _ in lines))


def real_section(name: str) -> str:
    text = REAL.read_text()
    return text.split(f"=== {name}\n", 1)[1].split("=== rc ", 1)[0]


def test_real_h200_host_reads_loaded_module_and_library() -> None:
    """The real host (a container: no /boot, no /lib/modules, libraries under
    /usr/local/nvidia/lib64): loaded 580.159.04 from /sys/module, the library's version
    through the loader's cache, one kernel (the running one) and no module file for it."""
    state = GpuKernel().parse(real_section("gpukernel"), 0)
    assert state.present and state.running == "6.18.44-fc-v657-gpu"
    assert state.loaded == state.library == "580.159.04"
    assert [k.release for k in state.kernels] == [state.running] and not state.kernels[0].module
    nv = Nvidia().parse(real_section("nvidia"), 0)
    assert not LockPackages().parse(real_section("lockpackages"), 0).installed
    facts = HostFacts("h200", {GpuKernel(): state, Nvidia(): nv,
                               LockPackages(): LockedPackages()})
    row = kernel_row(facts, locked=True)
    assert row is not None and not row["reboot_pending"]
    text = flat(kernel_lines("h200", row))
    assert "driver 580.159.04 loaded = library; held (gpu_node_lock)" in text
    assert "loaded now, it would not load at the next boot" in text


#: nvidia-smi after an upgrade behind the loaded module's back, as a 580 host printed it
#: (zzzhouuu/truenas-nvidia-drivers#19: libraries 580.178.04, module 580.173.02; exit 18)
MISMATCH = ("Failed to initialize NVML: Driver/library version mismatch\n"
            "NVML library version: 580.178")


def test_a_library_ahead_of_the_loaded_module_is_reboot_pending() -> None:
    nv = NvidiaState(True, error=MISMATCH, exit_code=18)
    known = GpuKernelState(True, "6.8.0-51-generic", (
        InstalledKernel("6.8.0-51-generic", "/lib/modules/6.8.0-51-generic/updates/dkms/"
                        "nvidia.ko.zst", "580.178.04"),), loaded="580.173.02",
        library="580.178.04")
    row = kernel_row(HostFacts("n", {GpuKernel(): known, Nvidia(): nv}), locked=False)
    assert row is not None and row["reboot_pending"] and not row["locked"]
    text = flat(kernel_lines("n", row))
    assert "driver 580.173.02 loaded, library 580.178.04: REBOOT PENDING" in text
    assert "gpu_node_lock is false on n" in text
    # where the kernel does not show the loaded version, nvidia-smi's words decide
    unknown = GpuKernelState(True, "6.8.0-51-generic", known.kernels)
    row = kernel_row(HostFacts("n", {GpuKernel(): unknown, Nvidia(): nv}), locked=True)
    assert row is not None and row["reboot_pending"] and row["library"] == "580.178"
    text = flat(kernel_lines("n", row))
    assert "nvidia-smi: Driver/library version mismatch (library 580.178)" in text


def test_a_new_kernel_without_module_and_a_stale_cdi_spec_are_warned() -> None:
    state = GpuKernelState(True, "6.8.0-51-generic", (
        InstalledKernel("6.8.0-51-generic", "/lib/modules/x/nvidia.ko", "580.95.05"),
        InstalledKernel("6.8.0-60-generic")), loaded="580.95.05", library="580.95.05",
        cdi_spec="/var/run/cdi/nvidia.yaml", cdi_driver="580.82.07")
    nv = NvidiaState(True, exit_code=0, module_version="580.95.05")
    row = kernel_row(HostFacts("n", {GpuKernel(): state, Nvidia(): nv}), locked=True)
    assert row is not None and row["newest"] == "6.8.0-60-generic"
    text = flat(kernel_lines("n", row))
    assert "no NVIDIA module for kernel 6.8.0-60-generic under /lib/modules: the GPUs are " \
        "lost if it boots" in text
    assert "CDI spec /var/run/cdi/nvidia.yaml was made for driver 580.82.07" in text


def test_kernel_releases_sort_as_grub_does() -> None:
    releases = ["6.8.0-100-generic", "6.8.0-51-generic", "6.8.0-9-generic", "6.18.44-fc-v657",
                "6.18.44-fc-v657-lab2"]
    assert sorted(releases, key=release_key) == [
        "6.8.0-9-generic", "6.8.0-51-generic", "6.8.0-100-generic", "6.18.44-fc-v657",
        "6.18.44-fc-v657-lab2"]


# -- upgrade --kernel: what it installs ----------------------------------------------------------
def test_the_kernel_upgrade_installs_the_target_s_counterparts() -> None:
    from gpuk8s.day2.kernelupgrade import metas, wanted_packages

    running = "6.8.0-51-generic"
    pkgs = LockedPackages({n: PackageState("1", True, "hi") for n in (
        f"linux-image-{running}", f"linux-headers-{running}", "linux-headers-6.8.0-51",
        f"linux-modules-{running}", f"linux-modules-nvidia-580-server-open-{running}",
        "linux-image-generic", "linux-headers-generic",
        "linux-modules-nvidia-580-server-open-generic", "linux-generic-hwe-24.04",
        "nvidia-driver-580-server-open")}, {"linux-image-generic": "6.8.0-60.63",
                                            "linux-headers-generic": "6.8.0-60.63"})
    assert metas(pkgs) == ["linux-generic-hwe-24.04", "linux-headers-generic",
                           "linux-image-generic",
                           "linux-modules-nvidia-580-server-open-generic"]
    assert wanted_packages(pkgs, running, None) == ["linux-headers-generic",
                                                    "linux-image-generic"]
    assert wanted_packages(pkgs, running, "6.8.0-60-generic") == [
        "linux-headers-6.8.0-60-generic", "linux-image-6.8.0-60-generic",
        "linux-modules-6.8.0-60-generic",
        "linux-modules-nvidia-580-server-open-6.8.0-60-generic"]


def test_a_module_for_the_new_kernel_must_match_the_library() -> None:
    from gpuk8s.day2.kernelupgrade import RELEASE, _module_ok

    ok51 = InstalledKernel("6.8.0-51-generic", "/m/nvidia.ko", "580.95.05")
    old60 = InstalledKernel("6.8.0-60-generic", "/n/nvidia.ko", "580.82.07")
    none61 = InstalledKernel("6.8.0-61-generic")
    ok60 = InstalledKernel("6.8.0-60-generic", "/n/nvidia.ko.zst", "580.95.05")

    def state(*k: InstalledKernel) -> GpuKernelState:
        return GpuKernelState(True, "6.8.0-51-generic", k)

    assert _module_ok(state(ok51, ok60), "6.8.0-60-generic", "580.95.05")[0]
    ok, why = _module_ok(state(ok51, old60), "6.8.0-60-generic", "580.95.05")
    assert not ok and "is 580.82.07, the driver's library is 580.95.05" in why
    ok, why = _module_ok(state(ok51, none61), "6.8.0-61-generic", "580.95.05")
    assert not ok and "no NVIDIA module was built or installed for kernel 6.8.0-61" in why
    assert not _module_ok(state(ok51), "6.8.0-62-generic", "")[0]
    # GRUB boots the newest image: a target older than another installed one is refused
    ok, why = _module_ok(state(ok51, ok60, none61), "6.8.0-60-generic", "580.95.05")
    assert not ok and "kernel 6.8.0-61-generic is installed too and newer" in why
    assert RELEASE.fullmatch("6.8.0-60-generic") and not RELEASE.fullmatch("6.8; reboot")


def test_a_driver_not_from_apt_leaves_a_no_op_once_the_kernel_is_held() -> None:
    held = {"linux-image-6.8.0-51-generic": ("6.8.0-51.52", True),
            "linux-image-generic": ("6.8.0-51.52", True)}
    hold, _ = plan(ctx(held, conf=True))
    assert not hold.changes
    assert "held (the driver was not installed with apt)" in hold.reason


def test_the_release_an_image_meta_brings() -> None:
    from gpuk8s.day2.kernelupgrade import release_of_meta

    # apt-cache depends linux-image-generic=6.8.0-60.63 (Ubuntu 24.04's shape)
    out = ("linux-image-generic\n  Depends: linux-image-6.8.0-60-generic\n"
           "  Depends: linux-firmware\n  Depends: intel-microcode\n")
    assert release_of_meta(out) == "6.8.0-60-generic"
    assert release_of_meta("linux-image-amd64\n  Depends: linux-image-6.1.0-28-amd64\n") == \
        "6.1.0-28-amd64"
    assert release_of_meta("x\n  Depends: linux-firmware\n") == ""
