"""Dynamic Resource Allocation as the cluster shows it (gpu_allocation: dra): the DeviceClasses
and the ValidatingAdmissionPolicy (and its binding) gpuk8s applied and, per node, the GPUs
NVIDIA's DRA driver published in ResourceSlices. Read
with kubectl and admin.conf on the first control plane, only when the inventory asks for DRA
(resource.k8s.io/v1 is served from Kubernetes 1.34)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gpuk8s.errors import FactError
from gpuk8s.facts import Fact, Source
from gpuk8s.facts.kube import ADMIN_CONF, KubeReads

DRIVER = "gpu.nvidia.com"


@dataclass(frozen=True)
class DraState:
    reachable: bool = False
    #: gpuk8s-managed DeviceClasses and ValidatingAdmissionPolicy(Binding)s: "Kind//name" ->
    #: sha256 annotation
    managed: dict[str, str] = field(default_factory=dict)
    #: node name -> {"gpu": n, "mig": m}: the driver's devices by type, over all its slices
    devices: dict[str, dict[str, int]] = field(default_factory=dict)


def parse_dra(classes: dict[str, Any], slices: dict[str, Any]) -> DraState:
    managed = {}
    for item in classes.get("items", []):
        meta = item.get("metadata", {})
        if meta.get("labels", {}).get("app.kubernetes.io/managed-by") == "gpuk8s":
            managed[f"{item.get('kind') or 'DeviceClass'}//{meta.get('name')}"] = \
                meta.get("annotations", {}).get("gpuk8s.io/sha256", "")
    devices: dict[str, dict[str, int]] = {}
    for item in slices.get("items", []):
        spec = item.get("spec", {})
        if spec.get("driver") != DRIVER or not spec.get("nodeName"):
            continue
        counts = devices.setdefault(str(spec["nodeName"]), {})
        for dev in spec.get("devices") or []:
            attrs = dev.get("attributes") or {}
            kind = (attrs.get("type") or {}).get("string", "")
            counts[str(kind)] = counts.get(str(kind), 0) + 1
    return DraState(True, managed, devices)


class Dra(Fact[DraState]):
    """DeviceClasses, admission policies and the NVIDIA driver's ResourceSlices (empty before
    kubeadm init). Both reads run side by side with the Cluster fact's (KubeReads)."""

    def sources(self) -> tuple[Source, ...]:
        return (KubeReads("dra_classes", "dra_slices"),)

    def command(self) -> str:
        # what kubectl printed on stderr when a read failed (the value only says it failed)
        return f"""[ -f {ADMIN_CONF} ] && command -v kubectl >/dev/null 2>&1 || exit 0
{self.sources()[0].ensure()}
[ "$_gk_k_dra_classes_rc" = 0 ] || {{
  [ -z "$_gk_k_dra_classes_err" ] || printf '%s\\n' "$_gk_k_dra_classes_err"; exit 3; }}
printf '%s\\n' "$_gk_k_dra_classes"; echo '## slices'
[ "$_gk_k_dra_slices_rc" = 0 ] || {{
  [ -z "$_gk_k_dra_slices_err" ] || printf '%s\\n' "$_gk_k_dra_slices_err"; exit 4; }}
printf '%s\\n' "$_gk_k_dra_slices"
"""

    def parse(self, output: str, exit_code: int) -> DraState:
        if exit_code == 0 and not output.strip():
            return DraState()
        if exit_code != 0:
            return DraState(False)
        classes, _, slices = output.partition("## slices\n")
        try:
            return parse_dra(json.loads(classes), json.loads(slices))
        except (ValueError, AttributeError, TypeError) as exc:
            raise FactError(f"kubectl returned DRA objects of an unexpected shape: {exc}"
                            ) from None
