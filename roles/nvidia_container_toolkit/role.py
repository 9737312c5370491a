"""nvidia_container_toolkit: the pinned toolkit and the nvidia runtime in containerd."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuk8s.checks import Rule, check_fingerprint, check_xyz
from gpuk8s.facts import Fact
from gpuk8s.facts.kube import Containerd
from gpuk8s.facts.system import Files, Packages, PciDevices
from gpuk8s.ops import Op, change, noop
from gpuk8s.ops.apt import packages, repo
from gpuk8s.ops.services import restart_containerd
from gpuk8s.roles import HostContext

LIST = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
KEYRING = "/etc/apt/keyrings/nvidia-container-toolkit-keyring.gpg"
DROP_IN = "/etc/containerd/conf.d/99-nvidia.toml"
PACKAGES = ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
            "libnvidia-container-tools", "libnvidia-container1")


#: this role's variables beyond their type (their defaults are in defaults.yaml)
RULES: dict[str, Rule] = {
    "nvidia_container_toolkit_repo_key_fingerprint": Rule(check_fingerprint),
    "nvidia_container_toolkit_version": Rule(check_xyz),
}


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [PciDevices(), Containerd(), Packages(*PACKAGES), Files(LIST, "+" + KEYRING, DROP_IN)]


def plan(ctx: HostContext) -> list[Op]:
    f = ctx.facts
    if not any(d.is_gpu for d in f[PciDevices()]):
        return []
    states = f[Files(LIST, "+" + KEYRING, DROP_IN)]
    ops = [repo(states[LIST], states[KEYRING], "nvidia_container_toolkit | apt repo",
                name="nvidia-container-toolkit",
                url=ctx.var("nvidia_container_toolkit_repo_url"),
                suite="/", components="",
                key_url=ctx.var("nvidia_container_toolkit_repo_key_url"),
                fingerprint=ctx.var("nvidia_container_toolkit_repo_key_fingerprint"),
                fingerprint_var="nvidia_container_toolkit_repo_key_fingerprint",
                apt=ctx.apt)]
    version = f"{ctx.var('nvidia_container_toolkit_version')}-"
    pkg_op = packages(f[Packages(*PACKAGES)], "nvidia_container_toolkit | packages",
                      dict.fromkeys(PACKAGES, version), hold=True,
                      apt=ctx.apt)
    ops.append(pkg_op)
    containerd = f[Containerd()]
    default = bool(ctx.var("nvidia_container_runtime_default"))
    configured = "nvidia" in containerd.runtimes and states[DROP_IN].exists and \
        (containerd.default_runtime == "nvidia") == default
    if configured and not pkg_op.changes:
        ops.append(noop("nvidia_container_toolkit | containerd runtime",
                        "= nvidia runtime configured in containerd"
                        + (" (default)" if default else "")))
    else:
        flag = " --set-as-default" if default else ""
        ops.append(change("nvidia_container_toolkit | containerd runtime",
                          f"+ nvidia-ctk runtime configure --runtime=containerd{flag}",
                          f"rm -f {DROP_IN}",
                          f"nvidia-ctk runtime configure --runtime=containerd{flag}",
                          notify=("restart containerd",)))
    return ops


HANDLERS = {
    "restart containerd": lambda ctx: restart_containerd(
        "nvidia_container_toolkit | restart containerd"),
}
