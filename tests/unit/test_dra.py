"""gpu_allocation: dra (issue 19, part 2b): the NVIDIA DRA driver instead of the device plugin,
the ResourceSlice waits, switching modes, the DRA fact read from kubectl's JSON, and workloads
asking through ResourceClaimTemplates."""

from __future__ import annotations

from typing import Any

import yaml

from gpuk8s.facts import HostFacts
from gpuk8s.facts.dra import Dra, DraState, parse_dra
from gpuk8s.facts.kube import Cluster, ClusterState, NodeStatus
from gpuk8s.roles import HostContext, load_role
from gpuk8s.workloads import load_values, render
from tests.unit.scenarios import default_vars

NODES = {"gpu-01": {"name": "gpu-01", "gpus": 2, "model": "NVIDIA H100 80GB HBM3",
                    "schedulable": True, "sharing": {}},
         "gpu-02": {"name": "gpu-02", "gpus": 1, "model": "NVIDIA H200", "schedulable": True,
                    "sharing": {}}}


def _node(name: str) -> NodeStatus:
    return NodeStatus(name, True, False, "v1.36.2", "containerd://2.1.4", None, {})


def _plan(dra: DraState, managed: dict[str, str] | None = None, **vars: Any) -> list[Any]:
    values = default_vars(**vars)
    facts = HostFacts("cp-01", {Cluster(): ClusterState(True, "", {n: _node(n) for n in NODES},
                                                        managed or {}), Dra(): dra})
    return load_role("gpu_cluster").plan(HostContext("cp-01", "gpu_cluster", values, facts,
                                                     {"nodes": NODES}, ("control_plane",)))


def _slice(node: str, types: list[str]) -> dict[str, Any]:
    return {"spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": {"name": node},
                     "devices": [{"name": f"gpu-{i}", "attributes": {
                         "type": {"string": t}, "uuid": {"string": f"GPU-{i}"}}}
                         for i, t in enumerate(types)]}}


def test_the_fact_counts_each_nodes_devices_by_type() -> None:
    state = parse_dra({"items": [{"metadata": {"name": "gpu.nvidia.com", "labels": {
        "app.kubernetes.io/managed-by": "gpuk8s"}, "annotations": {"gpuk8s.io/sha256": "x"}}}]},
                      {"items": [_slice("gpu-01", ["gpu", "gpu"]), _slice("gpu-02", ["mig"]),
                                 {"spec": {"driver": "other.example.com", "nodeName": "gpu-02",
                                           "devices": [{"name": "d"}]}}]})
    assert state.managed == {"DeviceClass//gpu.nvidia.com": "x"}
    assert state.devices == {"gpu-01": {"gpu": 2}, "gpu-02": {"mig": 1}}


def test_dra_deploys_the_driver_not_the_device_plugin_and_waits_per_node() -> None:
    ops = _plan(DraState(True), gpu_allocation="dra")
    ids = [op.id for op in ops]
    assert "gpu_cluster | device plugin" not in ids
    assert "gpu_cluster | NVIDIA DRA driver" in ids
    manifest = "\n".join(next(op for op in ops if op.id.endswith("DRA driver")).commands)
    assert "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:v0.4.0" in manifest
    assert "kind: DeviceClass" in manifest and "name: mig.nvidia.com" in manifest
    waits = [op for op in ops if "ResourceSlice" in op.id]
    assert [op.reason for op in waits] == [
        "+ wait until gpu-01 publishes 2 gpu device(s) (now 0)",
        "+ wait until gpu-02 publishes 1 gpu device(s) (now 0)"]
    done = DraState(True, {}, {"gpu-01": {"gpu": 2}, "gpu-02": {"gpu": 1}})
    waits = [op for op in _plan(done, gpu_allocation="dra") if "ResourceSlice" in op.id]
    assert not any(op.changes for op in waits)


def test_switching_modes_removes_the_other_ones_objects() -> None:
    plugin = {"DaemonSet/kube-system/nvidia-device-plugin-daemonset": "x"}
    ops = _plan(DraState(True), plugin, gpu_allocation="dra")
    (remove,) = [op for op in ops if op.id.endswith("remove the other GPU allocation")]
    # one form for every name: the real kubectl refuses "daemonset NAME configmap/NAME"
    assert "delete daemonset/nvidia-device-plugin-daemonset configmap/" in remove.commands[0]
    back = _plan(DraState(True), {"Namespace//nvidia-dra-driver-gpu": "y"})
    (remove,) = [op for op in back if op.id.endswith("remove the other GPU allocation")]
    assert "delete namespace nvidia-dra-driver-gpu" in remove.commands[0]
    assert "delete deviceclass gpu.nvidia.com mig.nvidia.com" in remove.commands[0]


def test_preflight_refuses_dra_before_1_34_and_time_slicing_with_dra() -> None:
    from roles.preflight.role import inventory_check

    vars = default_vars(gpu_allocation="dra", gpu_sharing={"mode": "time-slicing",
                                                          "replicas": 2})
    ctx = HostContext("gpu-01", "preflight", vars, HostFacts("gpu-01", {}), {}, ("workers",))
    (problem,), _ = inventory_check(ctx)  # needs only the inventory: `check` says it too
    assert "time-slicing is a setting of NVIDIA's device plugin" in problem[1]
    old = default_vars(gpu_allocation="dra", kubernetes_version="1.33")
    ctx = HostContext("gpu-01", "preflight", old, HostFacts("gpu-01", {}), {}, ("workers",))
    (problem,), _ = inventory_check(ctx)
    assert problem[:2] == ("gpu_allocation", "gpu_allocation dra needs Kubernetes 1.34 or "
                           "newer (resource.k8s.io/v1); kubernetes_version is 1.33")


def test_a_dra_workload_claims_its_gpus_through_a_template() -> None:
    values = load_values("tensorflow-job", [], ["gpuAllocation=dra", "gpus=2"])
    docs = render("tensorflow-job", values)
    job = next(d for d in docs if d["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert container["resources"]["claims"] == [{"name": "gpus-train"}]
    assert pod["resourceClaims"] == [{"name": "gpus-train",
                                      "resourceClaimTemplateName": "tensorflow-job-gpus-2"}]
    (template,) = [d for d in docs if d["kind"] == "ResourceClaimTemplate"]
    assert template["apiVersion"] == "resource.k8s.io/v1"
    assert template["metadata"]["namespace"] == values["namespace"]
    assert template["metadata"]["labels"]["gpuk8s.io/workload"] == "tensorflow-job"
    assert template["spec"]["spec"]["devices"]["requests"] == [{
        "name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                    "allocationMode": "ExactCount", "count": 2}}]
    plain = render("tensorflow-job", load_values("tensorflow-job", [], ["gpus=2"]))
    assert not [d for d in plain if d["kind"] == "ResourceClaimTemplate"]
    assert yaml.safe_dump(plain).count("nvidia.com/gpu: 2") == 1


def test_verify_gives_a_mig_node_all_its_instances() -> None:
    from gpuk8s.workloads.verify import gpu_nodes

    node = {"metadata": {"name": "gpu-01", "labels": {
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "2",
        "nvidia.com/mig.config": "all-3g.40gb"}},
        "status": {"allocatable": {"nvidia.com/mig-3g.40gb": "4", "cpu": "2"}}}
    (n,) = gpu_nodes({"items": [node]})
    assert n["limits"] == {"nvidia.com/mig-3g.40gb": 4} and n["mig_offered"] == 4
    docs = render("verify", load_values("verify"), gpu_nodes=[n], stage="smi")
    limits = docs[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/mig-3g.40gb": 4}


def test_a_changed_mig_layout_restarts_the_plugin_that_read_the_old_one() -> None:
    mig = {**NODES["gpu-01"], "sharing": {"mode": "mig", "layout": "all-3g.40gb"}}
    nodes = {**NODES, "gpu-01": mig}
    facts = HostFacts("cp-01", {Cluster(): ClusterState(True, "", {n: _node(n) for n in nodes}),
                                Dra(): DraState(True, {}, {"gpu-01": {"gpu": 2},
                                                           "gpu-02": {"gpu": 1}})})
    ctx = HostContext("cp-01", "gpu_cluster", default_vars(gpu_allocation="dra"), facts,
                      {"nodes": nodes}, ("control_plane",))
    ops = load_role("gpu_cluster").plan(ctx)
    ids = [op.id for op in ops if op.changes]
    # the driver objects themselves are applied in this run: no restart needed for them
    assert "gpu_cluster | gpu-01 DRA plugin restart" not in ids
    assert "gpu_cluster | gpu-01 ResourceSlice mig devices" in ids
    # the driver runs as applied: its plugin on gpu-01 must start again to see the MIG devices
    from gpuk8s.ops.kube import stamp

    _, keys, digest = stamp(ctx.template("gpu/nvidia-dra-driver.yaml.j2").decode(),
                            "nvidia-dra-driver")
    applied = ClusterState(True, "", {n: _node(n) for n in nodes},
                           {k: digest for k in keys if not k.startswith("DeviceClass")})
    dra = DraState(True, {k: digest for k in keys if k.startswith("DeviceClass")},
                   {"gpu-01": {"gpu": 2}, "gpu-02": {"gpu": 1}})
    ctx = HostContext("cp-01", "gpu_cluster", default_vars(gpu_allocation="dra"),
                      HostFacts("cp-01", {Cluster(): applied, Dra(): dra}), {"nodes": nodes},
                      ("control_plane",))
    ops = {op.id: op for op in load_role("gpu_cluster").plan(ctx) if op.changes}
    restart = ops["gpu_cluster | gpu-01 DRA plugin restart"]
    assert "--field-selector spec.nodeName=gpu-01" in restart.commands[0]
    assert "gpu_cluster | gpu-02 DRA plugin restart" not in ops
