"""kubernetes_upgrade: one node moved to another Kubernetes release in kubeadm's order.

The steps are kubeadm's documented upgrade, per node: the package repo of the target minor
(pkgs.k8s.io has one per minor; its key checked as bootstrap checks it), kubeadm, then
`kubeadm upgrade apply` on the first control plane (the cluster's static pods, kubeadm-config,
kube-proxy and CoreDNS) or `kubeadm upgrade node` elsewhere (a control plane's static pods,
every node's kubelet config), then kubelet and kubectl, and a kubelet restart. The runner's
upgrade phases (gpuk8s.playbook.UPGRADE_PHASES) drain the node before, and wait for it to be
Ready with its GPUs before they uncordon it. ``kubernetes_upgrade_target`` comes from `invoke
upgrade --kubernetes`, with ``kubernetes_version`` set to its minor for the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpuk8s.checks import Rule, matching
from gpuk8s.facts import Fact
from gpuk8s.facts.system import Files, Packages
from gpuk8s.ops import Op, change, noop
from gpuk8s.ops.apt import packages
from gpuk8s.ops.kube import KUBE_PACKAGES, KUBEADM_PATCHES, KUBECTL, release_prefix
from gpuk8s.roles import HostContext
from roles.kubelet.role import HEALTHZ
from roles.kubernetes.role import KEYRING, LIST, repo_op

CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"
#: seconds the control planes get to be Ready before `kubeadm upgrade apply`
READY_WAIT = 180

#: kubeadm writes the static pod manifests again on upgrade: this node's patches (the API
#: server's bind address beside the local load balancer) are given again, or they are lost
WITH_PATCHES = f'p=""; if [ -d {KUBEADM_PATCHES} ]; then p="--patches {KUBEADM_PATCHES}"; fi\n'

RULES: dict[str, Rule] = {
    "kubernetes_upgrade_target": Rule(matching(
        r"1\.\d+(\.\d+)?", 'a Kubernetes release like "1.37" or "1.36.2"',
        '"" (invoke upgrade --kubernetes sets it for its run)', or_empty=True)),
}


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [Packages(*KUBE_PACKAGES), Files(LIST, "+" + KEYRING)]


def restart_kubelet(ctx: HostContext) -> Op:
    """The kubelet restarted on its new binary, answering its health check, at that release."""
    timeout = int(ctx.var("kubelet_restart_timeout"))
    script = f"""\
systemctl daemon-reload
systemctl restart kubelet
end=$(( $(date +%s) + {timeout} ))
until curl -sf --max-time 5 {HEALTHZ} >/dev/null 2>&1; do
  [ "$(date +%s)" -lt "$end" ] || {{ echo "the kubelet did not answer {HEALTHZ} within \
{timeout}s after its upgrade; see: journalctl -u kubelet" >&2; exit 1; }}
  sleep 1
done
kubelet --version"""
    return change("kubernetes_upgrade | restart kubelet", "restart the kubelet on its new "
                  "release", script, timeout=timeout + 60)


HANDLERS = {"restart kubelet": restart_kubelet}


def plan(ctx: HostContext) -> list[Op]:
    target = str(ctx.var("kubernetes_upgrade_target"))
    op_id = "kubernetes_upgrade | release"
    if not target:
        return [noop(op_id, "= no upgrade asked for")]
    want = release_prefix(target)
    installed = ctx.facts[Packages(*KUBE_PACKAGES)]
    if not ctx.cluster.get("joined", {}).get(ctx.host):
        return [noop(op_id, "= not in a cluster: bootstrap installs it at the inventory's "
                     "release")]
    if all(p in installed and installed[p].version.startswith(want) for p in KUBE_PACKAGES):
        return [noop(op_id, f"= kubeadm, kubelet, kubectl {installed['kubeadm'].version}")]
    first = ctx.cluster["nodes"][ctx.host]["name"] == ctx.cluster["node_name"]
    if first:
        # kubeadm's preflight refuses while a control plane is NotReady, which this one is for
        # a while when the container_runtime role just restarted containerd (a new pause
        # image): wait for them first. Then the release kubeadm was installed at, e.g.
        # v1.37.2 for a target of 1.37.
        upgrade = change(
            "kubernetes_upgrade | kubeadm upgrade apply",
            f"+ kubeadm upgrade apply to the installed kubeadm's {target} release (the "
            "cluster's static pods, kubeadm-config, kube-proxy, CoreDNS)",
            f"{KUBECTL} wait --for=condition=Ready nodes -l {CONTROL_PLANE_LABEL} "
            f"--timeout={READY_WAIT}s >/dev/null\n"
            + WITH_PATCHES + "v=v$(dpkg-query -W -f '${Version}' kubeadm | cut -d- -f1)\n"
            'kubeadm upgrade apply "$v" --yes $p', timeout=900 + READY_WAIT)
    else:
        upgrade = change("kubernetes_upgrade | kubeadm upgrade node",
                         "+ kubeadm upgrade node (this node's kubelet config; a control "
                         "plane's static pods)", WITH_PATCHES + "kubeadm upgrade node $p",
                         timeout=900)
    kubelet = packages(installed, "kubernetes_upgrade | kubelet, kubectl",
                       {"kubelet": want, "kubectl": want}, hold=True, apt=ctx.apt)
    return [repo_op(ctx),
            packages(installed, "kubernetes_upgrade | kubeadm", {"kubeadm": want}, hold=True,
                     apt=ctx.apt),
            upgrade,
            replace(kubelet, notify=("restart kubelet",))]
