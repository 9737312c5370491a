"""gpu_cluster: nodes Ready, GPU node labels, RuntimeClass nvidia, the NVIDIA device plugin,
then allocatable nvidia.com/gpu on every GPU node equals its PCI GPU count."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gpuk8s import dra
from gpuk8s.checks import Rule, check_xyz
from gpuk8s.facts import Fact
from gpuk8s.facts.dra import Dra
from gpuk8s.facts.kube import Cluster
from gpuk8s.gpusharing import (
    MIG_LABEL,
    Sharing,
    check_gpu_sharing,
    config_map,
    node_labels,
    sharing_of,
)
from gpuk8s.ops import Op, change, noop, q
from gpuk8s.ops.kube import (
    KUBECTL,
    apply,
    labels,
    nodes_ready_wait,
    pod_diagnosis,
    rollout_wait,
    then_wait,
)
from gpuk8s.roles import HostContext
from gpuk8s.sinks import node_arg

#: this role's variables beyond their type (their defaults are in defaults.yaml)
RULES: dict[str, Rule] = {
    "nvidia_device_plugin_version": Rule(check_xyz, cluster_wide=True),
    "gpu_sharing": Rule(check_gpu_sharing),
    "gpu_allocation": Rule(choices=dra.MODES, cluster_wide=True),
    "nvidia_dra_driver_version": Rule(check_xyz, cluster_wide=True),
}


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [Cluster(), Dra()] if vars.get("gpu_allocation") == "dra" else [Cluster()]


def label_value(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")[:63]


def plan(ctx: HostContext) -> list[Op]:
    cluster = ctx.facts[Cluster()]
    nodes: Mapping[str, Mapping[str, Any]] = ctx.cluster["nodes"]
    timeout = int(ctx.var("join_ready_timeout"))
    ops: list[Op] = []
    waiting = sorted(n["name"] for n in nodes.values()
                     if n["name"] not in cluster.nodes or not cluster.nodes[n["name"]].ready)
    if waiting:
        ops.append(change("gpu_cluster | nodes Ready", f"+ wait for {', '.join(waiting)} Ready",
                          nodes_ready_wait(waiting, timeout),
                          timeout=timeout + 30))
    else:
        ops.append(noop("gpu_cluster | nodes Ready", f"= {len(nodes)} nodes Ready"))
    gpu_nodes = {h: n for h, n in nodes.items() if n["gpus"] and n.get("schedulable", True)}
    for node in nodes.values():
        if node["gpus"] and not node.get("schedulable", True):
            ops.append(noop(f"gpu_cluster | {node['name']} GPUs",
                            f"= {node['name']} is a control plane that takes no workloads: its "
                            f"{node['gpus']} GPU(s) are not offered to pods "
                            "(control_plane_schedulable: true offers them)"))
    for node in gpu_nodes.values():
        ops.append(labels(cluster, f"gpu_cluster | labels {node['name']}", node["name"], {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.count": str(node["gpus"]),
            "nvidia.com/gpu.product": label_value(node["model"]),
        }))
    if not gpu_nodes:
        return ops
    ops.append(apply(cluster, "gpu_cluster | RuntimeClass nvidia", "runtimeclass-nvidia",
                     ctx.template("gpu/runtimeclass.yaml.j2").decode()))
    sharing = {h: sharing_of(n.get("sharing")) for h, n in gpu_nodes.items()}
    mode = str(ctx.var("gpu_allocation"))
    ops += dra.remove_other(cluster, mode)
    if mode == "dra":
        expected = {h: _dra_devices(sharing[h], n) for h, n in gpu_nodes.items()}
        for host, node in gpu_nodes.items():
            ops.append(labels(cluster, f"gpu_cluster | MIG label {node['name']}", node["name"],
                              {MIG_LABEL: node_labels(sharing[host])[MIG_LABEL]}))
        return ops + dra.driver_ops(cluster, ctx.facts[Dra()], ctx.template(
            "gpu/nvidia-dra-driver.yaml.j2").decode(), gpu_nodes, expected,
            int(ctx.var("gpu_ready_timeout")))
    mig = any(s.mode == "mig" for s in sharing.values())
    manifest = ctx.template("gpu/nvidia-device-plugin.yaml.j2",
                            device_plugin_mig=mig).decode() + "---\n" + \
        json.dumps(config_map(sharing.values()), indent=2) + "\n"
    plugin_op = apply(cluster, "gpu_cluster | device plugin", "nvidia-device-plugin", manifest)
    gpu_timeout = int(ctx.var("gpu_ready_timeout"))
    if plugin_op.changes:
        # a changed DaemonSet replaces the plugin's pods node by node: wait until every GPU
        # node runs the new one, so no later wait sees a node's GPUs just before they go
        plugin_op = then_wait(plugin_op, "it runs on every GPU node", rollout_wait(
            (("kube-system", "daemonset/nvidia-device-plugin-daemonset",
              "name=nvidia-device-plugin-ds"),), gpu_timeout), gpu_timeout + 60)
    ops.append(plugin_op)
    # one node at a time: its config label, then its GPUs offered, then the next node
    for host, node in gpu_nodes.items():
        label_op = labels(cluster, f"gpu_cluster | sharing {node['name']}", node["name"],
                          node_labels(sharing[host]))
        ops.append(label_op)
        have = cluster.nodes.get(node["name"])
        want = sharing[host].resources(node["gpus"], node["model"])
        got = have.nvidia if have else {}
        if sharing[host].mode == "mig" and have is not None and not label_op.changes and \
                not plugin_op.changes and any(got.get(k) != v for k, v in want.items()):
            # the same config, new MIG instances: the plugin enumerates devices at start only
            # (a changed DaemonSet has just restarted it). Wait until the old pod is gone, or
            # the wait below could read the old pod's count just before it is withdrawn.
            ops.append(change(f"gpu_cluster | {node['name']} device plugin restart",
                              f"+ restart the device plugin on {node['name']} to offer its "
                              "new MIG instances",
                              f"{KUBECTL} -n kube-system delete pod -l "
                              f"name=nvidia-device-plugin-ds --field-selector "
                              f"{q('spec.nodeName=' + node['name'])} --wait=true "
                              f"--timeout={gpu_timeout}s", timeout=gpu_timeout + 30))
        for resource, count in want.items():
            # a changed DaemonSet rolls the plugin's pods on every node: its resources are
            # registered again, so each node is waited for, not only those short of them
            ops.append(_offer(node, resource, count, got.get(resource), sharing[host],
                              gpu_timeout, restarted=bool(plugin_op.changes)))
    return ops


def _dra_devices(sharing: Sharing, node: Mapping[str, Any]) -> dict[str, int]:
    """The devices NVIDIA's DRA driver publishes for a node: its GPUs, or its MIG devices."""
    if sharing.mode == "mig":
        return {"mig": sum(sharing.resources(node["gpus"], node["model"]).values())}
    return {"gpu": int(node["gpus"])}


def _offer(node: Mapping[str, Any], resource: str, want: int, got: int | None,
           sharing: Sharing, timeout: int, restarted: bool = False) -> Op:
    """A no-op when the node offers ``want`` of ``resource`` (and the device plugin is not
    restarting: ``restarted``), else a wait for it."""
    name = node["name"]
    op_id = f"gpu_cluster | {name} allocatable {resource}"
    slots = f" ({node['gpus']} GPU(s) x {sharing.replicas})" if sharing.replicas > 1 else \
        f" (MIG {sharing.layout_name})" if sharing.mode == "mig" else ""
    if got == want and not restarted:
        return noop(op_id, f"= {name}: {got} {resource} allocatable{slots}")
    again = " again, as the changed device plugin restarts" if got == want else ""
    path = "'{.status.allocatable." + resource.replace(".", "\\.") + "}'"
    diagnosis = pod_diagnosis("kube-system", "name=nvidia-device-plugin-ds", name,
                              "nvidia-device-plugin-ctr")
    return change(op_id, f"+ wait until {name} offers {want} {resource}{slots} "
                  f"(now {got if got is not None else 'none'}){again}",
                  f"{KUBECTL} wait --for=jsonpath={path}={want} "
                  f"{node_arg(name, 'node/')} --timeout={timeout}s || "
                  f"{{ echo {node_arg(name)}\": allocatable {resource} is "
                  f"$({KUBECTL} get node {node_arg(name)} -o "
                  f"jsonpath={path}), expected {want}\" >&2; "
                  f"{diagnosis}; exit 1; }}",
                  timeout=timeout + 30)

