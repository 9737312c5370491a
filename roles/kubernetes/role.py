"""kubernetes: the pkgs.k8s.io repo of the pinned minor; kubeadm, kubelet, kubectl held."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpuk8s.checks import (
    Rule,
    VarProblem,
    check_fingerprint,
    check_kubernetes_version,
    check_package_version,
    has_jinja,
    major_minor,
    pinned_key,
)
from gpuk8s.facts import Fact
from gpuk8s.facts.system import Files, Packages, Services
from gpuk8s.ops import Op, change, noop
from gpuk8s.ops.apt import packages, repo
from gpuk8s.ops.kube import KUBE_PACKAGES
from gpuk8s.roles import HostContext

LIST = "/etc/apt/sources.list.d/kubernetes.list"
KEYRING = "/etc/apt/keyrings/kubernetes-apt-keyring.gpg"
PACKAGES = KUBE_PACKAGES


def _package_of_the_minor(values: Mapping[str, Any]) -> VarProblem | None:
    """kubernetes_package_version is a release of kubernetes_version."""
    kube = major_minor(values.get("kubernetes_version"))
    pkg = values.get("kubernetes_package_version")
    if kube and isinstance(pkg, str) and pkg and not has_jinja(pkg):
        want = f"{kube[0]}.{kube[1]}."
        if re.match(r"\d+\.\d+\.", pkg) and not pkg.startswith(want):
            return VarProblem(
                "kubernetes_package_version", f"kubernetes_package_version {pkg} is not a "
                f"{kube[0]}.{kube[1]} release (kubernetes_version)",
                f'write kubernetes_package_version: "{want}N-1.1" or change kubernetes_version',
                others=("kubernetes_version",))
    return None


#: this role's variables beyond their type (their defaults are in defaults.yaml)
RULES: dict[str, Rule] = {
    "kubernetes_package_version": Rule(check_package_version, across=_package_of_the_minor),
    "kubernetes_repo_key_fingerprint": Rule(check_fingerprint, across=pinned_key(
        "kubernetes_repo_key_url", "kubernetes_repo_key_fingerprint")),
    "kubernetes_version": Rule(check_kubernetes_version, cluster_wide=True),
}


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [Packages(*PACKAGES), Files(LIST, "+" + KEYRING), Services("kubelet")]


def version_prefix(vars: Mapping[str, Any]) -> str:
    return str(vars["kubernetes_package_version"]) or f"{vars['kubernetes_version']}."


def plan(ctx: HostContext) -> list[Op]:
    f = ctx.facts
    states = f[Files(LIST, "+" + KEYRING)]
    ops = [repo(states[LIST], states[KEYRING], "kubernetes | pkgs.k8s.io repo",
                name="kubernetes", url=ctx.var("kubernetes_repo_url"),
                suite="/", components="",
                key_url=ctx.var("kubernetes_repo_key_url"),
                fingerprint=ctx.var("kubernetes_repo_key_fingerprint"),
                fingerprint_var="kubernetes_repo_key_fingerprint", apt=ctx.apt)]
    prefix = version_prefix(ctx.vars)
    ops.append(packages(f[Packages(*PACKAGES)], "kubernetes | packages",
                        dict.fromkeys(PACKAGES, prefix), hold=True, apt=ctx.apt))
    kubelet = f[Services("kubelet")]["kubelet"]
    if kubelet.enabled != "enabled":
        ops.append(change("kubernetes | kubelet enabled", "+ enable kubelet (it waits for "
                          "kubeadm init/join)", "systemctl enable kubelet"))
    else:
        ops.append(noop("kubernetes | kubelet enabled", "= kubelet enabled"))
    return ops
