"""GPUs through Dynamic Resource Allocation (``gpu_allocation: dra``, Kubernetes >= 1.34):
NVIDIA's DRA driver for GPUs instead of the device plugin. Its kubelet plugin publishes each
node's GPUs (and MIG devices) in ResourceSlices; pods get them through ResourceClaims for the
DeviceClasses gpu.nvidia.com and mig.nvidia.com. Switching between the two allocation modes
removes the other one's objects first: both offering the same GPUs would hand one GPU to two
pods."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gpuk8s.facts.dra import DRIVER, DraState
from gpuk8s.facts.kube import ClusterState
from gpuk8s.ops import Op, change, noop, q
from gpuk8s.ops.kube import KUBECTL, apply, pod_diagnosis

MODES = ("device-plugin", "dra")
NAMESPACE = "nvidia-dra-driver-gpu"
#: the DeviceClasses the driver's manifest defines (templates/gpu/nvidia-dra-driver.yaml.j2)
DEVICE_CLASSES = ("gpu.nvidia.com", "mig.nvidia.com")
#: the objects each mode leaves when the other is chosen: (managed key, delete command)
DEVICE_PLUGIN_OBJECTS = (
    ("DaemonSet/kube-system/nvidia-device-plugin-daemonset",
     f"{KUBECTL} -n kube-system delete daemonset/nvidia-device-plugin-daemonset "
     "configmap/nvidia-device-plugin-configs serviceaccount/nvidia-device-plugin "
     "clusterrolebinding/gpuk8s-nvidia-device-plugin clusterrole/gpuk8s-nvidia-device-plugin "
     "--ignore-not-found"),)
#: the ValidatingAdmissionPolicy (and its binding) that keeps the kubelet plugin's
#: ResourceSlice writes to its own node (templates/gpu/nvidia-dra-driver.yaml.j2)
SLICE_POLICY = "gpuk8s-nvidia-dra-driver-gpu-resourceslices"
DRA_OBJECTS = (
    (f"Namespace//{NAMESPACE}",
     f"{KUBECTL} delete namespace {NAMESPACE} --ignore-not-found --timeout=120s && "
     f"{KUBECTL} delete deviceclass {' '.join(DEVICE_CLASSES)} --ignore-not-found && "
     f"{KUBECTL} delete clusterrolebinding,clusterrole "
     "gpuk8s-nvidia-dra-driver-gpu-kubeletplugin --ignore-not-found && "
     f"{KUBECTL} delete validatingadmissionpolicybinding,validatingadmissionpolicy "
     f"{SLICE_POLICY} --ignore-not-found"),)


def remove_other(cluster: ClusterState, mode: str) -> list[Op]:
    """Delete the other allocation mode's objects when the cluster still has them."""
    other = DRA_OBJECTS if mode == "device-plugin" else DEVICE_PLUGIN_OBJECTS
    name = "the DRA driver" if mode == "device-plugin" else "the device plugin"
    stale = [cmd for key, cmd in other if key in cluster.managed]
    if not stale:
        return []
    return [change("gpu_cluster | remove the other GPU allocation",
                   f"+ remove {name} (gpu_allocation is {mode})", *stale)]


def driver_ops(cluster: ClusterState, dra: DraState, manifest: str,
               gpu_nodes: Mapping[str, Mapping[str, Any]], expected: Mapping[str, dict[str, int]],
               timeout: int) -> list[Op]:
    """Apply the DRA driver and its DeviceClasses, then wait, node by node, until each GPU
    node's ResourceSlices hold as many devices as it has (GPUs, or MIG devices)."""
    merged = dataclasses.replace(cluster, managed={**cluster.managed, **dra.managed})
    ops = [apply(merged, "gpu_cluster | NVIDIA DRA driver", "nvidia-dra-driver", manifest)]
    for host, node in gpu_nodes.items():
        name = str(node["name"])
        have = dra.devices.get(name, {})
        if not ops[0].changes and name in dra.devices and \
                any(have.get(k, 0) != v for k, v in expected[host].items()):
            # the driver's kubelet plugin reads the node's devices when it starts only: after
            # a MIG layout change it must start again to publish the new devices
            ops.append(change(f"gpu_cluster | {name} DRA plugin restart",
                              f"+ restart the DRA kubelet plugin on {name} to publish its "
                              "new devices",
                              f"{KUBECTL} -n {NAMESPACE} delete pod -l "
                              "nvidia-dra-driver-gpu-component=kubelet-plugin --field-selector "
                              f"{q('spec.nodeName=' + name)} --wait=false"))
        for kind, want in expected[host].items():
            op_id = f"gpu_cluster | {name} ResourceSlice {kind} devices"
            if have.get(kind, 0) == want:
                ops.append(noop(op_id, f"= {name}: {want} {kind} device(s) in ResourceSlices "
                                f"of {DRIVER}"))
                continue
            ops.append(change(op_id, f"+ wait until {name} publishes {want} {kind} device(s) "
                              f"(now {have.get(kind, 0)})", wait_slices(name, kind, want,
                                                                        timeout),
                              timeout=timeout + 30))
    return ops


def wait_slices(node: str, kind: str, want: int, timeout: int) -> str:
    """Poll the node's ResourceSlices of the NVIDIA driver until they list ``want`` devices of
    ``kind`` (kubectl's jsonpath filter; no jq on nodes)."""
    path = ("{range .items[?(@.spec.nodeName==\"" + node + "\")]}{.spec.driver}{\" \"}"
            "{range .spec.devices[*]}{.attributes.type.string}{\" \"}{end}{\"\\n\"}{end}")
    count = (f"{KUBECTL} get resourceslices -o jsonpath={q(path)} | "
             f"awk '$1 == \"{DRIVER}\" {{ for (i = 2; i <= NF; i++) if ($i == \"{kind}\") n++ }}"
             " END { print n + 0 }'")
    diagnosis = pod_diagnosis(NAMESPACE, "nvidia-dra-driver-gpu-component=kubelet-plugin", node,
                              "gpus")
    return (f"end=$(( $(date +%s) + {timeout} )); "
            f"while n=$({count}); [ \"$n\" -ne {want} ]; do "
            f"if [ \"$(date +%s)\" -ge \"$end\" ]; then echo {q(node)}\": the DRA driver "
            f"publishes $n {kind} device(s), expected {want}\" >&2; "
            f"{diagnosis}; exit 1; fi; "
            "sleep 2; done")
