"""``gpuAllocation: dra``: a workload's GPU pods ask through a ResourceClaimTemplate (NVIDIA's
DRA driver, DeviceClass gpu.nvidia.com) instead of ``limits: nvidia.com/gpu``. The templates
keep writing the limit; this turns every container's limit into a claim on a template of
exactly that many GPUs, one template per count, in the workload's namespace."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuk8s.workloads.values import WorkloadError

MODES = ("device-plugin", "dra")
RESOURCE = "nvidia.com/gpu"
DEVICE_CLASS = "gpu.nvidia.com"
TEMPLATE = ("resource.k8s.io/v1", "ResourceClaimTemplate")


def claim_template(name: str, namespace: str, count: int) -> dict[str, Any]:
    return {"apiVersion": TEMPLATE[0], "kind": TEMPLATE[1],
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [{
                "name": "gpus", "exactly": {"deviceClassName": DEVICE_CLASS,
                                            "allocationMode": "ExactCount", "count": count}}]}}}}


def use_claims(workload: str, docs: list[dict[str, Any]], pod_specs: list[dict[str, Any]],
               values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``docs`` with the GPU limits of ``pod_specs`` (the docs' pod specs, changed in place)
    turned into claims, plus the ResourceClaimTemplates they name."""
    mode = values.get("gpuAllocation", "device-plugin")
    if mode not in MODES:
        raise WorkloadError(f"gpuAllocation {mode!r} is not one of {', '.join(MODES)}; "
                            "use --set gpuAllocation=dra on a cluster with gpu_allocation: dra")
    if mode != "dra":
        return docs
    counts: set[int] = set()
    for spec in pod_specs:
        for c in spec.get("containers") or []:
            limits = (c.get("resources") or {}).get("limits") or {}
            count = int(limits.pop(RESOURCE, 0) or 0)
            if count <= 0:
                continue
            claim = f"gpus-{c['name']}"
            c["resources"].setdefault("claims", []).append({"name": claim})
            spec.setdefault("resourceClaims", []).append({
                "name": claim, "resourceClaimTemplateName": f"{workload}-gpus-{count}"})
            counts.add(count)
    templates = [claim_template(f"{workload}-gpus-{n}", str(values["namespace"]), n)
                 for n in sorted(counts)]
    return docs + templates
