"""The ValidatingAdmissionPolicy gpuk8s ships with NVIDIA's DRA driver (security review 2, M1):
the kubelet plugin's token lies on every GPU node, so its ResourceSlice writes are bound to the
node its pod-bound token names. Each row of FACTS is a fact read in upstream's source at the tag
cited beside it; the rendered manifest is held against them. The policy's evaluation (cel-python
in the lab's API server) is tests/unit/test_lab_admission.py; on the booted lab,
tests/lab/product/test_dra.py."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpuk8s import dra
from gpuk8s.checks import SUPPORTED_KUBERNETES
from gpuk8s.roles import render
from tests.unit.scenarios import default_vars

Obj = dict[str, Any]

#: (what, value, where it was read)
FACTS: list[tuple[str, Any, str]] = [
    ("ServiceAccount user extra key of the token's node",
     "authentication.kubernetes.io/node-name",
     "kubernetes/apiserver pkg/authentication/serviceaccount/util.go@kubernetes-1.34.0 "
     "NodeNameKey; ServiceAccountInfo.UserInfo sets it when the token names a node"),
    ("a pod-bound token carries its pod's node (name, uid)", "kubernetes.io.node",
     "kubernetes pkg/serviceaccount/claims.go Claims (case pod != nil, "
     "ServiceAccountTokenPodNodeInfo); Validate copies it into NodeName/NodeUID"),
    ("ServiceAccountTokenPodNodeInfo: alpha 1.29, beta (on) 1.30, GA and locked on", "1.32",
     "kubernetes pkg/features/kube_features.go defaultVersionedKubernetesFeatureGates: 1.29 "
     "Alpha, 1.30 Beta (default on), 1.32 GA LockToDefault (KEP-4193)"),
    ("ValidatingAdmissionPolicy API", "admissionregistration.k8s.io/v1",
     "GA in Kubernetes 1.30 (KEP-3488)"),
    ("policy shape: failurePolicy Fail, CREATE/UPDATE/DELETE of resource.k8s.io "
     "resourceslices, matchCondition on the plugin's username, binding with validationActions "
     "[Deny] and no matchResources",
     "dra-example-driver",
     "kubernetes-sigs/dra-example-driver deployments/helm/dra-example-driver/templates/"
     "validatingadmissionpolicy.yaml, validatingadmissionpolicybinding.yaml@v0.4.0"),
    ("message without a node",
     "no node association found for user, this user must run in a pod on a node and "
     "ServiceAccountTokenPodNodeInfo must be enabled",
     "kubernetes-sigs/dra-example-driver validatingadmissionpolicy.yaml@v0.4.0"),
    ("the plugin runs as <chart SA>-kubeletplugin, which NVIDIA's own policy does not name",
     "nvidia-dra-driver-gpu-kubeletplugin",
     "kubernetes-sigs/dra-driver-nvidia-gpu deployments/helm/dra-driver-nvidia-gpu/templates/"
     "kubeletplugin.yaml@v0.4.0 line 50 vs validatingadmissionpolicy.yaml@v0.4.0 "
     "isRestrictedUser (issue #1317)"),
    ("the GPU kubelet plugin's only API writes: ResourceSlice create/update/delete",
     "resourceslices",
     "kubernetes-sigs/dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin@v0.4.0 (MPS Deployments "
     "only with the MPSSupport gate, not granted) and vendor/k8s.io/dynamic-resource-allocation/"
     "resourceslice/resourceslicecontroller.go@v0.4.0 lines 836, 898, 954"),
    ("refusal text", "ValidatingAdmissionPolicy '%s' with binding '%s' denied request: %s",
     "kubernetes/apiserver pkg/admission/plugin/policy/validating/dispatcher.go@"
     "kubernetes-1.34.0 Dispatch"),
]
NODE_KEY = FACTS[0][1]
SA_NAMESPACE, SA_NAME = "nvidia-dra-driver-gpu", "nvidia-dra-driver-gpu-kubeletplugin"


def docs() -> list[Obj]:
    return [d for d in yaml.safe_load_all(render("gpu_cluster", "gpu/nvidia-dra-driver.yaml.j2",
                                                 default_vars(gpu_allocation="dra"))) if d]


def one(kind: str) -> Obj:
    (doc,) = [d for d in docs() if d["kind"] == kind]
    return doc


def test_every_fact_cites_its_source() -> None:
    assert all(what and value and where for what, value, where in FACTS)


def test_every_supported_kubernetes_has_the_node_claim_and_the_api() -> None:
    ga = tuple(int(x) for x in FACTS[2][1].split("."))
    assert all(tuple(int(x) for x in v.split(".")) >= ga for v in SUPPORTED_KUBERNETES)
    assert one("ValidatingAdmissionPolicy")["apiVersion"] == FACTS[3][1]
    assert one("ValidatingAdmissionPolicyBinding")["apiVersion"] == FACTS[3][1]


def test_the_policy_has_the_example_drivers_shape() -> None:
    policy, binding = one("ValidatingAdmissionPolicy"), one("ValidatingAdmissionPolicyBinding")
    spec = policy["spec"]
    assert policy["metadata"]["name"] == dra.SLICE_POLICY
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"], rule["operations"]) == (
        ["resource.k8s.io"], ["resourceslices"], ["CREATE", "UPDATE", "DELETE"])
    assert "v1" in rule["apiVersions"]
    assert binding["spec"] == {"policyName": dra.SLICE_POLICY, "validationActions": ["Deny"]}


def test_only_the_kubelet_plugins_service_account_is_constrained() -> None:
    """The matchCondition names the user the DaemonSet's pods run as (NVIDIA's chart names
    another one: its policy never applies to its plugin), so the admin and the control plane
    (the controller-manager removes a deleted node's slices) are left alone."""
    ds = one("DaemonSet")
    user = (f"system:serviceaccount:{ds['metadata']['namespace']}:"
            f"{ds['spec']['template']['spec']['serviceAccountName']}")
    assert user == f"system:serviceaccount:{SA_NAMESPACE}:{SA_NAME}" and FACTS[6][1] == SA_NAME
    (cond,) = one("ValidatingAdmissionPolicy")["spec"]["matchConditions"]
    assert cond["expression"] == f"request.userInfo.username == '{user}'"


def test_the_node_is_the_tokens_and_the_slices() -> None:
    spec = one("ValidatingAdmissionPolicy")["spec"]
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert f"request.userInfo.extra['{NODE_KEY}'][0]" in variables["userNodeName"]
    assert f"'{NODE_KEY}' in request.userInfo.extra" in variables["userNodeName"]
    # a delete has no object: its node is the old object's
    assert variables["objectNodeName"].count(
        "(request.operation == 'DELETE' ? oldObject : object).spec.nodeName") == 2
    # plain CEL: the lab's cel-python has no optional types (`?.`, `[?`, orValue)
    assert not any("?." in e or "[?" in e or "orValue" in e for e in variables.values())
    checks = [v["expression"] for v in spec["validations"]]
    assert checks == ["variables.userNodeName != ''",
                      "variables.userNodeName == variables.objectNodeName"]
    assert spec["validations"][0]["message"] == FACTS[5][1]
    assert spec["validations"][1]["messageExpression"].startswith(
        "\"this user running on node '\" + variables.userNodeName + \"' may not modify \"")


def test_the_policy_comes_before_the_plugin() -> None:
    kinds = [d["kind"] for d in docs()]
    assert kinds.index("ValidatingAdmissionPolicyBinding") < kinds.index("DaemonSet")


@pytest.mark.parametrize("group, resource", [("", "nodes"), ("", "pods"),
                                             ("resource.k8s.io", "resourceclaims")])
def test_the_plugin_may_write_nothing_but_slices(group: str, resource: str) -> None:
    """The policy binds the slice writes; the plugin has no other write to bind."""
    rules = one("ClusterRole")["rules"]
    writes = {"create", "update", "patch", "delete", "deletecollection", "*"}
    assert not [r for r in rules if group in r["apiGroups"] and resource in r["resources"]
                and writes & set(r["verbs"])]
    written = {res for r in rules if writes & set(r["verbs"]) for res in r["resources"]}
    assert written == {FACTS[7][1]}


def test_back_to_the_device_plugin_removes_the_policy() -> None:
    ((key, command),) = dra.DRA_OBJECTS
    assert key == f"Namespace//{SA_NAMESPACE}"
    assert command.endswith("delete validatingadmissionpolicybinding,validatingadmissionpolicy "
                            f"{dra.SLICE_POLICY} --ignore-not-found")


def test_a_second_run_finds_the_policy_applied() -> None:
    """The Dra fact reads the policy and its binding (the Cluster fact does not list admission
    kinds), so a second bootstrap changes nothing."""
    from gpuk8s.facts.dra import parse_dra
    from gpuk8s.ops.kube import stamp
    from tests.unit.test_dra import _plan

    manifest = render("gpu_cluster", "gpu/nvidia-dra-driver.yaml.j2",
                      default_vars(gpu_allocation="dra"))
    _, keys, digest = stamp(manifest, "nvidia-dra-driver")
    listed = [{"kind": k.split("/")[0], "metadata": {
        "name": k.split("/")[2], "labels": {"app.kubernetes.io/managed-by": "gpuk8s"},
        "annotations": {"gpuk8s.io/sha256": digest}}} for k in keys
        if k.split("/")[0] in ("DeviceClass", "ValidatingAdmissionPolicy",
                               "ValidatingAdmissionPolicyBinding")]
    assert len(listed) == 4
    state = parse_dra({"items": listed}, {"items": []})
    assert f"ValidatingAdmissionPolicyBinding//{dra.SLICE_POLICY}" in state.managed
    others = {k: digest for k in keys if k not in state.managed}
    ops = _plan(state, others, gpu_allocation="dra")
    (driver,) = [op for op in ops if op.id == "gpu_cluster | NVIDIA DRA driver"]
    assert not driver.changes, driver.reason
