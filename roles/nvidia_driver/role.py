"""nvidia_driver: nouveau off, headers, the pinned driver branch, Fabric Manager on NVSwitch
systems, a reboot only when the loaded module is not the installed one, then nvidia-smi must
see every PCI GPU."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpuk8s.checks import (
    Rule,
    VarProblem,
    check_driver_branch,
    check_driver_version,
    check_fingerprint,
    has_jinja,
    pinned_key,
)
from gpuk8s.facts import Fact
from gpuk8s.facts.nvidia import Nvidia
from gpuk8s.facts.system import (
    Files,
    KernelModules,
    OsRelease,
    Packages,
    PciDevices,
    Services,
    System,
)
from gpuk8s.ops import Op, change, files, noop
from gpuk8s.ops.apt import packages, repo
from gpuk8s.roles import HostContext, NvidiaDriverExports

BLACKLIST = "/etc/modprobe.d/blacklist-nouveau.conf"
CUDA_LIST = "/etc/apt/sources.list.d/cuda.list"
CUDA_KEYRING = "/etc/apt/keyrings/cuda-archive-keyring.gpg"
#: The open kernel modules run on Turing and later GPUs only; the lowest PCI device id in their
#: compatibility table is TU102's 0x1e02 (NVIDIA/open-gpu-kernel-modules README.md "Compatible
#: GPUs", every release). Every NVIDIA display-class id below 0x1e00 is Volta (V100, V100S,
#: TITAN V: 0x1d81-0x1df6), Pascal (P100 0x15f7-0x15f9, P40 0x1b38, P4 0x1bb3, ...) or older
#: (pci.ids), so those get the proprietary module.
FIRST_TURING_ID = 0x1E00


def _version_on_the_branch(values: Mapping[str, Any]) -> VarProblem | None:
    """nvidia_driver_version is a release of nvidia_driver_branch."""
    branch, drv = values.get("nvidia_driver_branch"), values.get("nvidia_driver_version")
    if isinstance(branch, str) and isinstance(drv, str) and drv and not has_jinja(drv) \
            and re.fullmatch(r"\d{3}", branch) and not drv.startswith(branch + "."):
        return VarProblem(
            "nvidia_driver_version", f"nvidia_driver_version {drv} is not on branch {branch} "
            "(nvidia_driver_branch)", f'write nvidia_driver_version: "{branch}.x.y-1" or ""',
            others=("nvidia_driver_branch",))
    return None


#: this role's variables beyond their type (their defaults are in defaults.yaml)
RULES: dict[str, Rule] = {
    "nvidia_cuda_repo_key_fingerprint": Rule(check_fingerprint, across=pinned_key(
        "nvidia_cuda_repo_key_url", "nvidia_cuda_repo_key_fingerprint")),
    "nvidia_driver_branch": Rule(check_driver_branch),
    "nvidia_driver_flavor": Rule(choices=("auto", "open", "proprietary")),
    "nvidia_driver_source": Rule(choices=("auto", "ubuntu", "cuda")),
    "nvidia_driver_version": Rule(check_driver_version, across=_version_on_the_branch),
    "nvidia_fabricmanager": Rule(choices=("auto", True, False)),
}


def driver_source(vars: Mapping[str, Any], os_: Mapping[str, str]) -> str:
    source = str(vars["nvidia_driver_source"])
    if source == "auto":
        return "ubuntu" if os_.get("ID") == "ubuntu" else "cuda"
    return source


def flavour(vars: Mapping[str, Any], devices: Any) -> str:
    wanted = str(vars["nvidia_driver_flavor"])
    if wanted != "auto":
        return wanted
    return "proprietary" if any(pre_turing(d) for d in devices) else "open"


def pre_turing(device: Any) -> bool:
    """A GPU older than Turing, which the open kernel modules do not drive."""
    try:
        return device.is_gpu and int(device.device, 16) < FIRST_TURING_ID
    except ValueError:
        return False


def fabricmanager_package(vars: Mapping[str, Any], os_: Mapping[str, str]) -> str:
    """Fabric Manager's package for the driver's source and branch. Ubuntu's archive ships
    it per branch only (`nvidia-fabricmanager-580`, multiverse, source fabric-manager-580);
    NVIDIA's CUDA repository names it `nvidia-fabricmanager` from branch 580 on and
    `nvidia-fabricmanager-<branch>` before (NVIDIA/cloud-native-stack
    playbooks/nvidia-driver.yaml)."""
    branch = str(vars["nvidia_driver_branch"])
    if driver_source(vars, os_) == "cuda" and branch.isdigit() and int(branch) >= 580:
        return "nvidia-fabricmanager"
    return f"nvidia-fabricmanager-{branch}"


def driver_packages(vars: Mapping[str, Any], os_: Mapping[str, str], devices: Any,
                    kernel: str, headers_installed: bool) -> dict[str, str]:
    """Package -> version prefix for the driver (and the running kernel's headers when they
    are missing), by source and flavour."""
    branch = str(vars["nvidia_driver_branch"])
    prefix = str(vars["nvidia_driver_version"]) or f"{branch}."
    open_ = flavour(vars, devices) == "open"
    headers = {} if headers_installed else {f"linux-headers-{kernel}": ""}
    if driver_source(vars, os_) == "ubuntu":
        name = f"nvidia-driver-{branch}-server" + ("-open" if open_ else "")
        return {**headers, name: prefix}
    meta = f"nvidia-open-{branch}" if open_ else f"cuda-drivers-{branch}"
    return {**headers, meta: prefix}


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [OsRelease(), System(), PciDevices(), Nvidia(),
            KernelModules("nouveau"),
            Files("+" + BLACKLIST, CUDA_LIST, "+" + CUDA_KEYRING),
            Packages(*driver_package_names(vars)),
            Services("nvidia-fabricmanager")]


def driver_package_names(vars: Mapping[str, Any]) -> list[str]:
    """Every top-level driver package of the branch, whatever the source and flavour."""
    b = vars["nvidia_driver_branch"]
    return ["nvidia-fabricmanager", f"nvidia-fabricmanager-{b}", f"nvidia-open-{b}",
            f"cuda-drivers-{b}",
            f"nvidia-driver-{b}-server", f"nvidia-driver-{b}-server-open"]


def cuda_repo_op(ctx: HostContext, op_id: str) -> Op:
    """The NVIDIA CUDA apt repo (drivers, CUDA toolkit, Fabric Manager)."""
    states = ctx.facts[Files("+" + BLACKLIST, CUDA_LIST, "+" + CUDA_KEYRING)]
    return repo(states[CUDA_LIST], states[CUDA_KEYRING], op_id, name="cuda",
                url=ctx.var("nvidia_cuda_repo_url"), suite="/", components="",
                key_url=ctx.var("nvidia_cuda_repo_key_url"),
                fingerprint=ctx.var("nvidia_cuda_repo_key_fingerprint"),
                fingerprint_var="nvidia_cuda_repo_key_fingerprint", apt=ctx.apt)


def plan(ctx: HostContext) -> list[Op]:
    f = ctx.facts
    devices = f[PciDevices()]
    gpus = [d for d in devices if d.is_gpu]
    if not gpus:
        return []
    os_ = f[OsRelease()]
    sysinfo = f[System()]
    nv = f[Nvidia()]
    installed = f[Packages(*driver_package_names(ctx.vars))]
    ctx.cluster.setdefault("driver_source", {})[ctx.host] = driver_source(ctx.vars, os_)
    preinstalled = _preinstalled(ctx, nv, installed, len(gpus))
    if preinstalled is not None:
        return preinstalled
    ops: list[Op] = []
    states = f[Files("+" + BLACKLIST, CUDA_LIST, "+" + CUDA_KEYRING)]
    nouveau_loaded = bool(f[KernelModules("nouveau")].get("nouveau"))
    ops.append(files.content(states[BLACKLIST], "nvidia_driver | blacklist nouveau",
                             b"blacklist nouveau\noptions nouveau modeset=0\n",
                             notify=("update initramfs",) + (("reboot",) if nouveau_loaded
                                                              else ())))
    if driver_source(ctx.vars, os_) == "cuda":
        ops.append(cuda_repo_op(ctx, "nvidia_driver | CUDA apt repo"))
    wanted = driver_packages(ctx.vars, os_, devices, sysinfo.kernel, sysinfo.headers)
    # held unless the admin opted out of gpu_node_lock (which then unholds them)
    pkg_op = packages(installed, "nvidia_driver | driver packages", wanted,
                      hold=bool(ctx.var("gpu_node_lock")),
                      update_first=driver_source(ctx.vars, os_) == "ubuntu", pin_deps=True,
                      apt=ctx.apt)
    if pkg_op.changes:  # (replace keeps the op's meta: the packages `invoke lock` reads)
        pkg_op = replace(pkg_op, notify=("reboot", "verify driver"))
    if pkg_op.changes and nv.exit_code == 0 and nv.loaded_version:
        pkg_op = replace(pkg_op, reason=pkg_op.reason + " (replaces the loaded driver "
                         f"{nv.loaded_version})")
    ops.append(pkg_op)
    driver_pkg = next(n for n in wanted if not n.startswith("linux-headers"))
    installed_version = installed[driver_pkg].version if driver_pkg in installed else ""
    upstream = installed_version.split("-")[0]
    if pkg_op.changes:
        reboot = None
    elif not nv.smi_present or nv.exit_code != 0:
        reboot = (f"+ reboot: driver {upstream} installed but not loaded "
                  f"(nvidia-smi: {nv.error.splitlines()[0] if nv.error else 'absent'})")
    elif nv.loaded_version and upstream and nv.loaded_version != upstream:
        reboot = f"+ reboot: loaded driver {nv.loaded_version} is not the installed {upstream}"
    else:
        reboot = None
    if reboot:
        ops.append(change("nvidia_driver | load installed driver", reboot, "true",
                          notify=("reboot", "verify driver")))
    elif not pkg_op.changes:
        seen = len(nv.gpus)
        if seen != len(gpus):
            ops.append(change("nvidia_driver | verify", f"+ nvidia-smi sees {seen} of "
                              f"{len(gpus)} PCI GPUs: check", *verify_commands(len(gpus))))
        else:
            ops.append(noop("nvidia_driver | verify", f"= driver {nv.loaded_version} "
                            f"({nv.module or 'module'}) sees {seen}/{len(gpus)} GPUs"))
    nvswitch = any(d.is_nvswitch for d in devices)
    fm = ctx.var("nvidia_fabricmanager")
    if fm is True or fm == "true" or (fm == "auto" and nvswitch):
        fm_version = (str(ctx.var("nvidia_driver_version")) or upstream
                      or f"{ctx.var('nvidia_driver_branch')}.")
        ops.append(packages(installed, "nvidia_driver | fabric manager",
                            {fabricmanager_package(ctx.vars, os_): fm_version},
                            hold=bool(ctx.var("gpu_node_lock")),
                            apt=ctx.apt))
        unit = f[Services("nvidia-fabricmanager")]["nvidia-fabricmanager"]
        if unit.active != "active" or unit.enabled != "enabled":
            ops.append(change("nvidia_driver | fabric manager service",
                              "+ enable and start nvidia-fabricmanager",
                              "systemctl enable nvidia-fabricmanager",
                              "systemctl start nvidia-fabricmanager || "
                              "[ -e /var/run/reboot-required ]"))
    return ops


def _preinstalled(ctx: HostContext, nv: Any, installed: Mapping[str, Any],
                  gpus: int) -> list[Op] | None:
    """A working driver that apt did not install (a vendor image, a runfile, the GPU
    Operator's host driver) of the wanted branch and version is left alone."""
    ours = [n for n in driver_package_names(ctx.vars)
            if not n.startswith("nvidia-fabricmanager")]
    if any(n in installed for n in ours) or nv.exit_code != 0 or not nv.loaded_version:
        return None
    branch = nv.loaded_version.split(".")[0]
    pinned = str(ctx.var("nvidia_driver_version"))
    if branch != str(ctx.var("nvidia_driver_branch")) or \
            (pinned and not nv.loaded_version.startswith(pinned.split("-")[0])):
        return None  # another branch/version: plan the packages (an upgrade), shown as such
    seen = len(nv.gpus)
    if seen != gpus:
        return [change("nvidia_driver | verify", f"+ nvidia-smi sees {seen} of {gpus} PCI "
                       "GPUs: check", *verify_commands(gpus))]
    return [noop("nvidia_driver | driver packages", f"= driver {nv.loaded_version} "
                 f"({nv.module or 'kernel module'}) is loaded but was not installed with apt: "
                 "left as it is"),
            noop("nvidia_driver | verify", f"= driver {nv.loaded_version} sees "
                 f"{seen}/{gpus} GPUs")]


def verify_commands(count: int) -> tuple[str, ...]:
    return (f"n=$(nvidia-smi -L 2>&1 | grep -c '^GPU ') || true; "
            f"if [ \"$n\" -ne {count} ]; then echo \"nvidia-smi sees $n of {count} PCI GPUs:\"; "
            "nvidia-smi -L 2>&1 | head -n 20; exit 1; fi",)


HANDLERS = {
    "update initramfs": lambda ctx: change(
        "nvidia_driver | update initramfs", "update initramfs",
        "if command -v update-initramfs >/dev/null 2>&1 && [ -d /boot ] && "
        "ls /boot/initrd.img-* >/dev/null 2>&1; then update-initramfs -u; fi"),
    "reboot": lambda ctx: Op("nvidia_driver | reboot", (), "reboot to load the driver",
                             reboot=True),
    "verify driver": lambda ctx: change(
        "nvidia_driver | verify", "nvidia-smi must see every PCI GPU",
        *verify_commands(sum(d.is_gpu for d in ctx.facts[PciDevices()]))),
}

#: planned from the loaded module (nvidia-smi): "load installed driver" asks for the reboot,
#: and a driver that sees fewer GPUs than the PCI bus gets its check
REPLANNED_HANDLERS = ("reboot", "verify driver")

#: what other code uses of this role (gpuk8s.roles.exports)
EXPORTS = NvidiaDriverExports(driver_package_names=driver_package_names)
