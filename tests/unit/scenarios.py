"""Synthetic host facts for golden plans: fresh Ubuntu 22.04 / 24.04 / Debian 12 nodes."""

from __future__ import annotations

from typing import Any

from gpuk8s.facts import Fact, HostFacts
from gpuk8s.facts.certs import CertState
from gpuk8s.facts.controlplane import ControlPlaneHealthState
from gpuk8s.facts.kernel import GpuKernelState, LockedPackages
from gpuk8s.facts.kube import ClusterState, ContainerdState, GateState
from gpuk8s.facts.nvidia import NvidiaState, Topology
from gpuk8s.facts.system import FileState, PciDevice, SystemInfo, Unit
from gpuk8s.gather import fact_requests
from gpuk8s.variables import load_variable_specs

OSES = {
    "ubuntu2204": {"ID": "ubuntu", "VERSION_ID": "22.04", "VERSION_CODENAME": "jammy",
                   "PRETTY_NAME": "Ubuntu 22.04.5 LTS"},
    "ubuntu2404": {"ID": "ubuntu", "VERSION_ID": "24.04", "VERSION_CODENAME": "noble",
                   "PRETTY_NAME": "Ubuntu 24.04.3 LTS"},
    "debian12": {"ID": "debian", "VERSION_ID": "12", "VERSION_CODENAME": "bookworm",
                 "PRETTY_NAME": "Debian GNU/Linux 12 (bookworm)"},
}
KERNELS = {"ubuntu2204": "5.15.0-125-generic", "ubuntu2404": "6.8.0-51-generic",
           "debian12": "6.1.0-28-amd64"}


def default_vars(**overrides: Any) -> dict[str, Any]:
    values = {name: spec.default for name, spec in load_variable_specs().items()}
    values["ansible_user"] = "root"
    values.update(overrides)
    return values


def fresh_value(fact: Fact[Any], os_key: str, gpus: int, name: str) -> Any:
    kind = type(fact).__name__
    if kind == "OsRelease":
        return dict(OSES[os_key])
    if kind == "System":
        return SystemInfo(KERNELS[os_key], "x86_64", name, 8, 32000, "cgroup2fs",
                          f"uuid-{name}", f"mid-{name}", "boot-1", "none", "SecureBoot disabled",
                          "yes", ("/swap.img",) if os_key == "ubuntu2404" else (),
                          ("/swap.img",) if os_key == "ubuntu2404" else (), False, (22,), False)
    if kind == "PciDevices":
        return tuple(PciDevice(f"0000:{0x18 + i:02x}:00.0", "0x10de", "0x2330", "0x030200")
                     for i in range(gpus))
    if kind == "KernelModules":
        return {m: m == "overlay" for m in fact.args}
    if kind == "Sysctls":
        return {k: "0" for k in fact.args if not k.startswith("net.bridge")}
    if kind == "Files":
        return {a.lstrip("+"): FileState(a.lstrip("+"), False) for a in fact.args}
    if kind == "Packages":
        return {}
    if kind == "Services":
        return {u: Unit("inactive", "not-found") for u in fact.args}
    if kind == "PendingHandlers":
        return frozenset()
    if kind == "AptOsSources":  # the node's own sources, none set aside
        return (("/etc/apt/sources.list.d/ubuntu.sources",) if os_key.startswith("ubuntu")
                else ("/etc/apt/sources.list",)), ()
    if kind == "DpkgHealth":
        return {"interrupted": False, "reinstall": [], "lock_holders": []}
    if kind == "Containerd":
        return ContainerdState()
    if kind == "Nvidia":
        return NvidiaState(False)
    if kind == "CudaToolkits":
        return {}
    if kind == "MigState":
        return ()   # no driver yet: nvidia-smi cannot be asked
    if kind == "GpuTopology":
        return Topology()
    if kind == "Cluster":
        return ClusterState()
    if kind == "FeatureGates":
        return GateState()
    if kind == "ManagedRegistryHosts":
        return ()
    if kind == "RegistryAnswers":
        return {url: (200, "") for url in fact.args}
    if kind == "ControlPlaneHealth":
        return ControlPlaneHealthState()
    if kind == "LockPackages":
        return LockedPackages()
    if kind == "GpuKernel":
        return GpuKernelState()
    if kind == "CertExpiry":
        return CertState()
    if kind == "XidEvents":
        return ()
    if kind == "LocalSnapshots":
        return ()
    if kind == "Reaches":
        return dict.fromkeys(fact.args, "ok")
    raise AssertionError(f"no scenario value for fact {kind}")


def fresh_facts(os_key: str, gpus: int, name: str, vars: dict[str, Any]) -> HostFacts:
    return HostFacts(name, {f: fresh_value(f, os_key, gpus, name) for f in fact_requests(vars)})
