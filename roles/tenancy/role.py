"""tenancy: the lab's users and groups from the inventory (gpuk8s.tenancy), each a namespace
with its GPU quota, default requests and the edit role there only; namespaces of users no
longer in the inventory are reported, and deleted only with tenancy_prune (bootstrap
--prune)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuk8s import dra, tenancy
from gpuk8s.checks import Rule
from gpuk8s.facts import Fact
from gpuk8s.facts.kube import Cluster
from gpuk8s.gpusharing import sharing_of
from gpuk8s.ops import Op, change, noop, warn
from gpuk8s.ops.kube import KUBECTL, apply
from gpuk8s.roles import HostContext
from gpuk8s.sinks import node_arg

RULES: dict[str, Rule] = {
    "lab_users": Rule(tenancy.check_lab_users, cluster_wide=True,
                      across=tenancy.check_users_and_groups),
    "lab_groups": Rule(tenancy.check_lab_groups, cluster_wide=True),
    "tenancy_default_cpu_request": Rule(tenancy.check_quantity, cluster_wide=True),
    "tenancy_default_memory_request": Rule(tenancy.check_quantity, cluster_wide=True),
    "tenancy_default_memory_limit": Rule(tenancy.check_quantity_or_empty, cluster_wide=True),
    "tenancy_pod_security": Rule(choices=tenancy.POD_SECURITY, cluster_wide=True),
    "tenancy_prune": Rule(cluster_wide=True),
}


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [Cluster()]


def gpu_resources(nodes: Mapping[str, Mapping[str, Any]], offered: Any = ()) -> set[str]:
    """The GPU resources the cluster offers pods: nvidia.com/gpu always (a pod asking for it
    is counted even where no node has it), each MIG profile the nodes are split into, and
    any nvidia.com/* a node's allocatable shows (``offered``)."""
    out = {"nvidia.com/gpu"}
    for node in nodes.values():
        if node.get("gpus") and node.get("schedulable", True):
            out |= set(sharing_of(node.get("sharing")).resources(node["gpus"], node["model"]))
    return out | {r for r in offered if r.startswith("nvidia.com/")}


def plan(ctx: HostContext) -> list[Op]:
    cluster = ctx.facts[Cluster()]
    users = ctx.var("lab_users") or {}
    groups = ctx.var("lab_groups") or {}
    wanted = tenancy.tenants(users, groups)
    offered = {r for n in cluster.nodes.values() for r in n.nvidia}
    resources = gpu_resources(ctx.cluster["nodes"], offered)
    defaults = {"cpu_request": str(ctx.var("tenancy_default_cpu_request")),
                "memory_request": str(ctx.var("tenancy_default_memory_request")),
                "memory_limit": str(ctx.var("tenancy_default_memory_limit"))}
    security = str(ctx.var("tenancy_pod_security"))
    classes = dra.DEVICE_CLASSES if ctx.var("gpu_allocation") == "dra" else ()
    ops = [apply(cluster, f"tenancy | {t.kind} {t.name}", f"{tenancy.COMPONENT}-{t.name}",
                 tenancy.manifest(t, resources, defaults, security, classes)) for t in wanted]
    gone = sorted(tenancy.tenant_namespaces(cluster.managed) - {t.name for t in wanted})
    for ns in gone:
        op_id = f"tenancy | removed {ns}"
        if ctx.var("tenancy_prune"):
            ops.append(change(op_id, f"+ delete namespace {ns} and everything in it (no "
                              "longer in lab_users or lab_groups; --prune)",
                              f"{KUBECTL} delete {node_arg(ns, 'namespace/')} "
                              "--ignore-not-found --timeout=300s", timeout=330))
        else:
            # a warning, so every run shows it (a no-op's reason is printed only in plans)
            ops.append(warn(op_id, f"! namespace {ns} kept: {ns} is no longer in lab_users or "
                            "lab_groups (bootstrap --prune deletes it and everything in it)"))
    if not ops:
        ops.append(noop("tenancy | users", "= no lab_users or lab_groups"))
    return ops
