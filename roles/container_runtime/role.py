"""container_runtime: containerd 2.x (containerd.io from Docker's repo) with CRI and systemd
cgroups, or Docker CE on top of it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpuk8s.checks import (
    Rule,
    VarProblem,
    check_containerd_version,
    check_fingerprint,
    check_image_ref,
    check_registry_mirrors,
    has_jinja,
    major_minor,
    pinned_key,
)
from gpuk8s.facts import Fact
from gpuk8s.facts.kube import CERTS_D, Containerd, ManagedRegistryHosts
from gpuk8s.facts.system import Files, FileState, OsRelease, Packages, Services
from gpuk8s.ops import Op, change, files, noop, q, warn
from gpuk8s.ops import registry as reg
from gpuk8s.ops.apt import packages, repo
from gpuk8s.ops.kube import KUBE_PACKAGES, KUBEADM_IMAGES, release
from gpuk8s.ops.services import restart_containerd
from gpuk8s.roles import ContainerRuntimeExports, HostContext

CONFIG = "/etc/containerd/config.toml"
LIST = "/etc/apt/sources.list.d/docker.list"
KEYRING = "/etc/apt/keyrings/docker.gpg"
PACKAGES = ("containerd.io", "docker-ce", "docker-ce-cli")


def _containerd_for_kubernetes(values: Mapping[str, Any]) -> VarProblem | None:
    """Kubernetes 1.36 and newer need containerd 2.x."""
    kube = major_minor(values.get("kubernetes_version"))
    containerd = values.get("containerd_version")
    if kube and kube >= (1, 36) and isinstance(containerd, str) and containerd \
            and not has_jinja(containerd):
        m = re.match(r"(\d+)\.", containerd)
        if m and int(m[1]) < 2:
            return VarProblem(
                "containerd_version", f"containerd {containerd} is 1.x, which Kubernetes "
                f"{kube[0]}.{kube[1]} does not support (1.35 was the last release for "
                "containerd 1.x)", 'write containerd_version: "2.1.4" (a 2.x release) or "", or '
                'kubernetes_version: "1.35" to stay on containerd 1.x',
                others=("kubernetes_version",))
    return None


#: this role's variables beyond their type (their defaults are in defaults.yaml)
RULES: dict[str, Rule] = {
    "container_runtime": Rule(choices=("containerd", "docker")),
    "containerd_version": Rule(check_containerd_version, across=_containerd_for_kubernetes),
    "containerd_sandbox_image": Rule(check_image_ref),
    "docker_repo_key_fingerprint": Rule(check_fingerprint, across=pinned_key(
        "docker_repo_key_url", "docker_repo_key_fingerprint")),
    "registry_mirrors": Rule(check_registry_mirrors),
}


def _mirror_files(vars: Mapping[str, Any]) -> Files:
    """hosts.toml and CA certificate of every registry with mirrors, and Docker's daemon.json."""
    wanted = reg.mirrors(vars["registry_mirrors"])
    paths = [f"+{reg.hosts_file(r)}" for r in wanted]
    paths += [f"+{reg.ca_path(r, m)}" for r, ms in wanted.items() for m in ms if m.ca_file]
    return Files(*paths, "+" + reg.DAEMON_JSON)


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [OsRelease(), Containerd(), Packages(*PACKAGES), Packages(*KUBE_PACKAGES),
            Files(LIST, "+" + KEYRING, "+" + CONFIG), Services("containerd", "docker"),
            ManagedRegistryHosts(), _mirror_files(vars)]


def sandbox_image(vars: Mapping[str, Any], minor: str | None = None) -> str:
    """containerd_sandbox_image, or the pause image kubeadm expects for ``minor`` (default
    kubernetes_version): kubeadm warns when containerd's differs."""
    image = vars["containerd_sandbox_image"]
    minor = minor or str(vars["kubernetes_version"])
    pause = KUBEADM_IMAGES.get(minor, KUBEADM_IMAGES["1.36"])[1]
    return image or f"registry.k8s.io/pause:{pause}"


def _kubeadm_minor(ctx: HostContext) -> str:
    """The Kubernetes minor whose kubeadm this node runs or is about to run: the inventory's,
    but on a joined node its installed kubeadm's (bootstrap never moves a joined node's
    release: roles/kubernetes), except in `invoke upgrade --kubernetes`, which sets
    kubernetes_version to the minor it moves the node to."""
    kubeadm = ctx.facts[Packages(*KUBE_PACKAGES)].get("kubeadm")
    if kubeadm and ctx.cluster.get("joined", {}).get(ctx.host) \
            and not ctx.var("kubernetes_upgrade_target"):
        have = release(kubeadm.version)
        if len(have) >= 2:
            return f"{have[0]}.{have[1]}"
    return str(ctx.var("kubernetes_version"))


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
    config = ctx.template("config.toml.j2",
                          sandbox_image=sandbox_image(ctx.vars, _kubeadm_minor(ctx)),
                          certs_d=CERTS_D)
    # nvidia-ctk re-marshals config.toml every time it writes its drop-in (go-toml v1: no
    # comments, sorted keys, every table a header; pkg/config/engine/containerd/
    # config_drop_in.go@v1.20.0 Save): the same settings in its layout are up to date
    ops.append(files.content(states[CONFIG], "container_runtime | config.toml", config,
                             notify=("restart containerd",),
                             equivalent=files.same_toml(config)))
    ops += mirror_ops(ctx)
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


def mirror_ops(ctx: HostContext) -> list[Op]:
    """One hosts.toml per registry with mirrors (and its mirrors' CA certificates); the
    hosts.toml gpuk8s wrote for registries no longer listed are removed. containerd reads them
    at every pull: no restart. With Docker, daemon.json's registry-mirrors (Docker Hub only) and
    insecure-registries, reloaded without a restart."""
    wanted = reg.mirrors(ctx.var("registry_mirrors"))
    states = ctx.facts[_mirror_files(ctx.vars)]
    ops: list[Op] = []
    for registry, ms in wanted.items():
        for m in ms:
            if m.ca_file:
                ops.append(files.content(states[reg.ca_path(registry, m)],
                                         f"container_runtime | CA of mirror {m.netloc}",
                                         reg.read_ca(m)))
        ops.append(files.content(states[reg.hosts_file(registry)],
                                 f"container_runtime | mirrors of {registry}",
                                 reg.hosts_toml(registry, ms)))
    for registry in ctx.facts[ManagedRegistryHosts()]:
        if registry not in wanted:
            ops.append(change(f"container_runtime | mirrors of {registry}",
                              f"- remove the mirrors of {registry} (no longer in "
                              "registry_mirrors)",
                              f"rm -f {q(reg.hosts_file(registry))} "
                              f"{q(reg.hosts_dir(registry))}/*.crt",
                              f"rmdir {q(reg.hosts_dir(registry))} 2>/dev/null || true"))
    if ctx.var("container_runtime") == "docker":
        ops.append(_docker_daemon(states[reg.DAEMON_JSON], wanted))
    return ops


def _docker_daemon(state: FileState, wanted: Mapping[str, list[reg.Mirror]]) -> Op:
    op_id = "container_runtime | docker daemon.json"
    settings = reg.docker_settings(wanted)
    merged = reg.merged_daemon_json(state.content if state.exists else None, settings)
    if merged is None:
        return warn(op_id, f"! {reg.DAEMON_JSON} is not a JSON object: gpuk8s leaves it alone, "
                    "so Docker's own pulls do not use registry_mirrors (pods do: containerd)")
    if not state.exists and not any(settings.values()):
        return noop(op_id, "= no registry mirrors for Docker")
    return files.content(state, op_id, merged, notify=("reload docker",))


HANDLERS = {
    "restart containerd": lambda ctx: restart_containerd(
        "container_runtime | restart containerd"),
    # registry-mirrors and insecure-registries are among the settings dockerd reloads on SIGHUP
    "reload docker": lambda ctx: change("container_runtime | reload docker", "reload docker",
                                        "systemctl reload docker"),
}

#: what other code uses of this role (gpuk8s.roles.exports)
EXPORTS = ContainerRuntimeExports(sandbox_image=sandbox_image)
