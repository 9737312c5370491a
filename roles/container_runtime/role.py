"""container_runtime: containerd 2.x (containerd.io from Docker's repo) with CRI and systemd
cgroups, or Docker CE on top of it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuk8s.checks import Rule, check_containerd_version, check_fingerprint
from gpuk8s.facts import Fact
from gpuk8s.facts.kube import Containerd
from gpuk8s.facts.system import Files, OsRelease, Packages, Services
from gpuk8s.ops import Op, change, files, noop
from gpuk8s.ops.apt import packages, repo
from gpuk8s.ops.services import restart_containerd
from gpuk8s.roles import HostContext

CONFIG = "/etc/containerd/config.toml"
LIST = "/etc/apt/sources.list.d/docker.list"
KEYRING = "/etc/apt/keyrings/docker.gpg"
#: sandbox (pause) image kubeadm expects, by Kubernetes minor
PAUSE = {"1.34": "3.10.1", "1.35": "3.10.1", "1.36": "3.10.1", "1.37": "3.10.1"}
PACKAGES = ("containerd.io", "docker-ce", "docker-ce-cli")


#: this role's variables beyond their type (their defaults are in defaults.yaml)
RULES: dict[str, Rule] = {
    "container_runtime": Rule(choices=("containerd", "docker")),
    "containerd_version": Rule(check_containerd_version),
    "docker_repo_key_fingerprint": Rule(check_fingerprint),
}


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [OsRelease(), Containerd(), Packages(*PACKAGES),
            Files(LIST, "+" + KEYRING, "+" + CONFIG), Services("containerd", "docker")]


def sandbox_image(vars: Mapping[str, Any]) -> str:
    image = vars["containerd_sandbox_image"]
    return image or f"registry.k8s.io/pause:{PAUSE.get(str(vars['kubernetes_version']), '3.10.1')}"


def plan(ctx: HostContext) -> list[Op]:
    f = ctx.facts
    os_ = f[OsRelease()]
    states = f[Files(LIST, "+" + KEYRING, "+" + CONFIG)]
    ops = [repo(states[LIST], states[KEYRING], "container_runtime | docker apt repo",
                name="docker", url=ctx.var("docker_repo_url"),
                suite=os_.get("VERSION_CODENAME", ""), components="stable",
                key_url=ctx.var("docker_repo_key_url"),
                fingerprint=ctx.var("docker_repo_key_fingerprint"),
                fingerprint_var="docker_repo_key_fingerprint", apt=ctx.apt)]
    wanted = {"containerd.io": ctx.var("containerd_version")}
    if ctx.var("container_runtime") == "docker":
        wanted |= {"docker-ce": "", "docker-ce-cli": ""}
    ops.append(packages(f[Packages(*PACKAGES)], "container_runtime | packages", wanted,
                        hold=True, apt=ctx.apt))
    config = ctx.template("config.toml.j2", sandbox_image=sandbox_image(ctx.vars))
    ops.append(files.content(states[CONFIG], "container_runtime | config.toml", config,
                             notify=("restart containerd",)))
    units = f[Services("containerd", "docker")]
    wanted_units = ["containerd"] + (["docker"] if ctx.var("container_runtime") == "docker"
                                     else [])
    down = [u for u in wanted_units
            if units[u].active != "active" or units[u].enabled != "enabled"]
    if down:
        ops.append(change("container_runtime | service", f"+ enable and start {' '.join(down)}",
                          f"systemctl enable --now {' '.join(down)}"))
    else:
        ops.append(noop("container_runtime | service", f"= {' '.join(wanted_units)} running"))
    return ops


HANDLERS = {
    "restart containerd": lambda ctx: restart_containerd(
        "container_runtime | restart containerd"),
}
