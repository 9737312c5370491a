"""gpu_node_lock: on GPU nodes, the running kernel and the NVIDIA driver held together, and
unattended-upgrades kept away from both, so the loaded module always matches the library
until an admin upgrades them on purpose (`invoke upgrade --kernel` / `--driver`).

Why: days after a good install, unattended-upgrades brings a new kernel or new libnvidia-*,
the loaded module no longer matches, nvidia-smi fails and GPU pods fail at their next start
(../shared pain point 1: kubespray#8540, akash-network/support#131 and others)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuk8s.checks import Rule
from gpuk8s.facts import Fact
from gpuk8s.facts.kernel import GLOB_ARGS, NOT_DRIVER, GpuKernel, LockPackages
from gpuk8s.facts.system import Files, PciDevices, System
from gpuk8s.ops import Op, change, files, noop
from gpuk8s.roles import HostContext

#: an apt.conf.d part that sorts after the package's 50unattended-upgrades, as its README
#: advises for local settings (unattended-upgrades@2.9.1 README.md); apt appends list
#: entries of later parts to the earlier ones (checked with apt 2.6.2's apt-config dump), so
#: the admin's own blacklist stays whole
UU_CONF = "/etc/apt/apt.conf.d/51gpuk8s-gpu-node-lock"
#: Package-Blacklist entries are Python regexes matched with re.match against the package
#: name: anchored at the start only (unattended-upgrade@2.9.1 is_pkgname_in_blacklist), so
#: "nvidia-" does not cover libnvidia-compute-580 and each family needs its own line; a
#: blacklisted package is never upgraded nor newly installed for another's dependency
#: (pinning_from_config makes each a "never" pin)
UU_BLACKLIST = ("linux-", "nvidia-", "libnvidia-", "cuda-", "libcuda",
                "xserver-xorg-video-nvidia")


def uu_conf() -> bytes:
    lines = ["// gpuk8s gpu_node_lock: unattended-upgrades leaves the kernel and the NVIDIA",
             "// driver alone on this GPU node (a new one would not match the loaded module",
             "// until a reboot); every other update keeps flowing. Upgrade them on purpose",
             "// (invoke upgrade --kernel / --driver), or set gpu_node_lock: false in the",
             "// inventory to manage them yourself. Managed by gpuk8s: edits are undone.",
             "Unattended-Upgrade::Package-Blacklist {",
             *(f'    "{p}";' for p in UU_BLACKLIST), "};", ""]
    return "\n".join(lines).encode()


#: this role's variables beyond their type (their defaults are in defaults.yaml)
RULES: dict[str, Rule] = {}


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    # GpuKernel is status's (gpuk8s.day2.status): listed so that every probe gathers it
    return [PciDevices(), System(), LockPackages(), GpuKernel(), Files(UU_CONF)]


def hold_script(action: str) -> str:
    """``apt-mark hold|unhold`` of every kernel and driver package installed when it runs
    (the node phase may have installed more since the probe), never the toolkit's."""
    return (f"n=$(dpkg-query -W -f='${{db:Status-Abbrev}} ${{binary:Package}}\\n' {GLOB_ARGS}"
            " 2>/dev/null"
            f" | awk '$1 ~ /^[ih]i/ {{print $2}}' | grep -Ev '^{NOT_DRIVER.pattern}' || true)\n"
            f'[ -z "$n" ] || apt-mark {action} $n >/dev/null')


def plan(ctx: HostContext) -> list[Op]:
    f = ctx.facts
    if not any(d.is_gpu for d in f[PciDevices()]):
        return []
    pkgs = f[LockPackages()]
    conf = f[Files(UU_CONF)][UU_CONF]
    kernel = f[System()].kernel
    driver = _driver_version(pkgs.driver)
    if not ctx.var("gpu_node_lock"):
        ops = []
        if pkgs.held:
            ops.append(change("gpu_node_lock | hold kernel and driver",
                              f"- unhold {', '.join(pkgs.held)} (gpu_node_lock is false: "
                              "kernel and driver updates are yours)", hold_script("unhold")))
        else:
            ops.append(noop("gpu_node_lock | hold kernel and driver",
                            "= not held (gpu_node_lock is false)"))
        ops.append(files.absent(conf, "gpu_node_lock | unattended-upgrades blacklist"))
        return ops
    waiting = "".join(f"; waiting: {n} {v}" for n, v in sorted(pkgs.waiting.items()))
    if not pkgs.installed:
        hold = change("gpu_node_lock | hold kernel and driver",
                      f"+ hold kernel {kernel}'s packages and the driver's once the node "
                      "phase has installed them", hold_script("hold"))
    elif pkgs.unheld:
        hold = change("gpu_node_lock | hold kernel and driver",
                      f"+ hold {', '.join(pkgs.unheld)} (kernel {kernel} and driver "
                      f"{driver or 'not from apt'} locked together)", hold_script("hold"))
    else:   # a driver apt did not install (a runfile, a vendor image): the kernel alone
        what = f"driver {driver} held together" if pkgs.driver else \
            "held (the driver was not installed with apt)"
        hold = noop("gpu_node_lock | hold kernel and driver",
                    f"= kernel {kernel} and {what} "
                    f"({len(pkgs.kernel)} kernel, {len(pkgs.driver)} driver packages)"
                    f"{waiting and waiting + ' (held back until upgraded on purpose)'}")
    return [hold, files.content(conf, "gpu_node_lock | unattended-upgrades blacklist",
                                uu_conf())]


def _driver_version(driver: Mapping[str, Any]) -> str:
    """The driver's upstream version, from its packages' (the most common one)."""
    versions = [s.version.split("-")[0] for n, s in driver.items()
                if n.startswith(("nvidia-", "libnvidia-", "cuda-drivers"))]
    return max(set(versions), key=versions.count) if versions else ""
