"""cni: the pod network (flannel or calico) from pinned manifests in templates/cni/."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuk8s.checks import (
    Rule,
    VarProblem,
    check_calico_block_size,
    check_mtu,
    check_positive,
    check_registry,
    check_xyz,
    parse_network,
)
from gpuk8s.errors import PlanError
from gpuk8s.facts import Fact
from gpuk8s.facts.kube import Cluster
from gpuk8s.ops import Op
from gpuk8s.ops.kube import apply, rollout_wait, then_wait
from gpuk8s.roles import HostContext


def _block_in_pod_cidr(values: Mapping[str, Any]) -> VarProblem | None:
    """With Calico, calico_block_size fits in pod_cidr (an IPv4 one)."""
    pod, block = values.get("pod_cidr"), values.get("calico_block_size")
    if values.get("cni") == "calico" and isinstance(pod, str) and isinstance(block, int):
        p = parse_network(pod)
        if p and p.version == 4 and p.prefixlen > block:
            return VarProblem("calico_block_size", f"calico_block_size /{block} is larger "
                              f"than pod_cidr {pod}: Calico cannot carve blocks from it",
                              f"write calico_block_size: {max(p.prefixlen, 20)} or widen "
                              "pod_cidr", others=("pod_cidr",))
    return None


#: this role's variables beyond their type (their defaults are in defaults.yaml)
RULES: dict[str, Rule] = {
    "calico_block_size": Rule(check_calico_block_size, cluster_wide=True,
                              across=_block_in_pod_cidr),
    "calico_mtu": Rule(check_mtu, cluster_wide=True),
    "calico_registry": Rule(check_registry, cluster_wide=True),
    "calico_version": Rule(check_xyz, cluster_wide=True),
    "cni": Rule(choices=("flannel", "calico"), cluster_wide=True),
    "cni_ready_timeout": Rule(check_positive, cluster_wide=True),
    "flannel_version": Rule(check_xyz, cluster_wide=True),
}


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [Cluster()]


#: the DaemonSet that shows which pod network a cluster runs
AGENTS = {"flannel": "DaemonSet/kube-flannel/kube-flannel-ds",
          "calico": "DaemonSet/kube-system/calico-node"}
#: what must be ready after a change: (namespace, kind/name, pod label selector)
WAIT = {"flannel": (("kube-flannel", "daemonset/kube-flannel-ds", "app=flannel"),),
        "calico": (("kube-system", "daemonset/calico-node", "k8s-app=calico-node"),
                   ("kube-system", "deployment/calico-kube-controllers",
                    "k8s-app=calico-kube-controllers"))}


def plan(ctx: HostContext) -> list[Op]:
    cni = ctx.var("cni")
    cluster = ctx.facts[Cluster()]
    running = [name for name, key in AGENTS.items() if name != cni and key in cluster.managed]
    if running:
        raise PlanError(
            f"cni: the cluster runs {running[0]}, the inventory asks for {cni}. Two pod networks "
            f"side by side break pod networking, and gpuk8s does not migrate one to the other. "
            f"Set cni: {running[0]} again, or rebuild the cluster with the new one "
            f"(invoke reset, then invoke bootstrap).")
    manifest = ctx.template(f"cni/{cni}.yaml.j2").decode()
    op = apply(cluster, f"cni | {cni}", cni, manifest)
    if not op.changes:
        return [op]
    timeout = int(ctx.var("cni_ready_timeout"))
    return [then_wait(op, "its agents are ready", rollout_wait(WAIT[cni], timeout),
                      len(WAIT[cni]) * timeout + 60)]
