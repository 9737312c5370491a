"""gpu_cluster: nodes Ready, GPU node labels, RuntimeClass nvidia, the NVIDIA device plugin,
then allocatable nvidia.com/gpu on every GPU node equals its PCI GPU count."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gpuk8s.checks import Rule, check_xyz
from gpuk8s.facts import Fact
from gpuk8s.facts.kube import Cluster
from gpuk8s.gpusharing import check_gpu_sharing, config_map, node_labels, sharing_of
from gpuk8s.ops import Op, change, noop
from gpuk8s.ops.kube import KUBECTL, apply, labels
from gpuk8s.roles import HostContext
from gpuk8s.sinks import node_arg

GPU_PATH = "'{.status.allocatable.nvidia\\.com/gpu}'"


#: this role's variables beyond their type (their defaults are in defaults.yaml)
RULES: dict[str, Rule] = {
    "nvidia_device_plugin_version": Rule(check_xyz, cluster_wide=True),
    "gpu_sharing": Rule(check_gpu_sharing),
}


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [Cluster()]


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
                          f"{KUBECTL} wait --for=condition=Ready "
                          + " ".join(node_arg(n, "node/") for n in waiting)
                          + f" --timeout={timeout}s",
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
    manifest = ctx.template("gpu/nvidia-device-plugin.yaml.j2").decode() + "---\n" + \
        json.dumps(config_map(sharing.values()), indent=2) + "\n"
    ops.append(apply(cluster, "gpu_cluster | device plugin", "nvidia-device-plugin", manifest))
    gpu_timeout = int(ctx.var("gpu_ready_timeout"))
    # one node at a time: its config label, then its GPUs offered, then the next node
    for host, node in gpu_nodes.items():
        ops.append(labels(cluster, f"gpu_cluster | sharing {node['name']}", node["name"],
                          node_labels(sharing[host])))
        want = sharing[host].offered(node["gpus"])
        have = cluster.nodes.get(node["name"])
        got = have.gpu_allocatable if have else None
        op_id = f"gpu_cluster | {node['name']} allocatable nvidia.com/gpu"
        slots = f" ({node['gpus']} GPU(s) x {sharing[host].replicas})" \
            if sharing[host].replicas > 1 else ""
        if got == want:
            ops.append(noop(op_id, f"= {node['name']}: {got} nvidia.com/gpu allocatable{slots}"))
            continue
        ops.append(change(op_id, f"+ wait until {node['name']} offers {want} nvidia.com/gpu"
                          f"{slots} (now {got if got is not None else 'none'})",
                          f"{KUBECTL} wait --for=jsonpath={GPU_PATH}={want} "
                          f"{node_arg(node['name'], 'node/')} --timeout={gpu_timeout}s || "
                          f"{{ echo {node_arg(node['name'])}\": allocatable nvidia.com/gpu is "
                          f"$({KUBECTL} get node {node_arg(node['name'])} -o "
                          f"jsonpath={GPU_PATH}), expected "
                          f"{want}\" >&2; exit 1; }}", timeout=gpu_timeout + 30))
    return ops
