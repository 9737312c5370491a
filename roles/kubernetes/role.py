"""kubernetes: the pkgs.k8s.io repo of the pinned minor; kubeadm, kubelet, kubectl held.

A node that has joined a cluster keeps its release here: moving it is `invoke upgrade
--kubernetes` (roles/kubernetes_upgrade, kubeadm's order), never a package swap under a
running kubelet, and never a downgrade."""

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
from gpuk8s.ops import Op, change, noop, warn
from gpuk8s.ops.apt import packages, repo
from gpuk8s.ops.kube import KUBE_PACKAGES, KUBE_REPO_KEYRING, KUBE_REPO_LIST, release
from gpuk8s.roles import HostContext

LIST = KUBE_REPO_LIST
KEYRING = KUBE_REPO_KEYRING
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


def repo_op(ctx: HostContext) -> Op:
    """The pkgs.k8s.io repo of ``kubernetes_version`` (one repo per minor), its key checked."""
    states = ctx.facts[Files(LIST, "+" + KEYRING)]
    return repo(states[LIST], states[KEYRING], "kubernetes | pkgs.k8s.io repo",
                name="kubernetes", url=ctx.var("kubernetes_repo_url"), suite="/", components="",
                key_url=ctx.var("kubernetes_repo_key_url"),
                fingerprint=ctx.var("kubernetes_repo_key_fingerprint"),
                fingerprint_var="kubernetes_repo_key_fingerprint", apt=ctx.apt)


def _held_back(ctx: HostContext, prefix: str) -> Op | None:
    """On a joined node whose kubeadm is not the inventory's release: a warning saying how to
    move it (or the inventory), instead of packages swapped under the running cluster."""
    kubeadm = ctx.facts[Packages(*PACKAGES)].get("kubeadm")
    if not ctx.cluster.get("joined", {}).get(ctx.host) or kubeadm is None \
            or kubeadm.version.startswith(prefix):
        return None
    have, want = release(kubeadm.version), release(prefix)
    minor = f"{have[0]}.{have[1]}"
    if have[:len(want)] > want:
        return warn("kubernetes | release", f"! kubeadm {kubeadm.version} runs this joined "
                    f"node, newer than the inventory's {prefix.rstrip('.-')}: gpuk8s never "
                    f"downgrades a cluster; write kubernetes_version: \"{minor}\""
                    + (' and kubernetes_package_version: ""'
                       if ctx.var("kubernetes_package_version") else ""))
    return warn("kubernetes | release", f"! this joined node runs kubeadm {kubeadm.version}; "
                f"the inventory asks for {prefix.rstrip('.-')}: a cluster moves with kubeadm's "
                "upgrade, not a package swap: run `invoke upgrade --kubernetes "
                f"{'.'.join(map(str, want))}`")


def plan(ctx: HostContext) -> list[Op]:
    f = ctx.facts
    prefix = version_prefix(ctx.vars)
    held = _held_back(ctx, prefix)
    if held is not None:
        ops = [held]
    else:
        ops = [repo_op(ctx), packages(f[Packages(*PACKAGES)], "kubernetes | packages",
                                      dict.fromkeys(PACKAGES, prefix), hold=True, apt=ctx.apt)]
    kubelet = f[Services("kubelet")]["kubelet"]
    if kubelet.enabled != "enabled":
        ops.append(change("kubernetes | kubelet enabled", "+ enable kubelet (it waits for "
                          "kubeadm init/join)", "systemctl enable kubelet"))
    else:
        ops.append(noop("kubernetes | kubelet enabled", "= kubelet enabled"))
    return ops
