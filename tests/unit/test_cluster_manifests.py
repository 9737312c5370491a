"""The cluster's own manifests (pod network, NVIDIA device plugin, RuntimeClass): every object
valid against the Kubernetes 1.36 OpenAPI schema in strict mode, images pinned, and the pod
network's address range the same as kubeadm's podSubnet."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpuk8s.roles import render
from gpuk8s.variables import check_combination, check_value, load_variable_specs
from tests.unit.scenarios import default_vars

K8S_SCHEMA = "1.36.0"
MANIFESTS = [("cni", "cni/flannel.yaml.j2"), ("cni", "cni/calico.yaml.j2"),
             ("gpu_cluster", "gpu/nvidia-device-plugin.yaml.j2"),
             ("gpu_cluster", "gpu/runtimeclass.yaml.j2")]


def docs(role: str, name: str, **overrides: Any) -> list[dict[str, Any]]:
    text = render(role, name, default_vars(**overrides))
    return [d for d in yaml.safe_load_all(text) if d]


def by(docs_: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs_ if d["kind"] == kind and d["metadata"]["name"] == name)


@pytest.mark.parametrize(("role", "name"), MANIFESTS)
def test_schema_and_pinned_images(role: str, name: str) -> None:
    rendered = docs(role, name)
    assert rendered
    for doc in rendered:
        kubernetes_validate.validate(doc, K8S_SCHEMA, strict=True)
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            tag = c["image"].rsplit("/", 1)[-1].partition(":")[2]
            assert tag and tag != "latest", f"{doc['metadata']['name']}: {c['image']} not pinned"


def test_calico_pool_is_pod_cidr_and_images_follow_version_and_registry() -> None:
    rendered = docs("cni", "cni/calico.yaml.j2", pod_cidr="10.32.0.0/16",
                    calico_version="3.31.7", calico_registry="mirror.lab:5000/dockerhub",
                    calico_block_size=24)
    node = by(rendered, "DaemonSet", "calico-node")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in node["containers"][0]["env"]}
    assert env["CALICO_IPV4POOL_CIDR"] == "10.32.0.0/16"
    assert env["CALICO_IPV4POOL_BLOCK_SIZE"] == "24"
    assert env["CALICO_IPV4POOL_VXLAN"] == "Always" and env["CALICO_IPV4POOL_IPIP"] == "Never"
    images = {c["image"] for c in [*node["initContainers"], *node["containers"]]}
    images.add(by(rendered, "Deployment", "calico-kube-controllers")["spec"]["template"]
               ["spec"]["containers"][0]["image"])
    assert images == {f"mirror.lab:5000/dockerhub/calico/{n}:v3.31.7"
                      for n in ("cni", "node", "kube-controllers")}


def test_calico_cni_config_is_json_once_filled_in() -> None:
    cm = by(docs("cni", "cni/calico.yaml.j2"), "ConfigMap", "calico-config")
    assert cm["data"]["calico_backend"] == "vxlan"
    filled = (cm["data"]["cni_network_config"].replace("__KUBERNETES_NODE_NAME__", "gpu-01")
              .replace("__CNI_MTU__", "1450")
              .replace("__KUBECONFIG_FILEPATH__", "/etc/cni/net.d/calico-kubeconfig"))
    conf = json.loads(filled)
    assert [p["type"] for p in conf["plugins"]] == ["calico", "portmap", "bandwidth"]
    assert conf["plugins"][0]["ipam"] == {"type": "calico-ipam"}


def test_calico_crds_are_served_in_their_groups() -> None:
    """Calico's own CRDs in crd.projectcalico.org, plus network-policy-api's
    ClusterNetworkPolicy that Felix watches; what RBAC grants on them is held against upstream
    in test_upstream_fidelity.py."""
    rendered = docs("cni", "cni/calico.yaml.j2")
    crds = [d for d in rendered if d["kind"] == "CustomResourceDefinition"]
    plurals = {d["spec"]["names"]["plural"] for d in crds}
    assert {"ippools", "ipamblocks", "blockaffinities", "felixconfigurations",
            "clusterinformations", "networkpolicies", "clusternetworkpolicies"} <= plurals
    for d in crds:
        assert d["metadata"]["name"] == f"{d['spec']['names']['plural']}.{d['spec']['group']}"
        assert d["spec"]["group"] in ("crd.projectcalico.org", "policy.networking.k8s.io")


@pytest.mark.parametrize(("name", "value", "message"), [
    ("calico_block_size", 19, "from 20 to 32"),
    ("calico_mtu", 576, "0 (detect) or from 1280 to 9000"),
    ("calico_registry", "https://quay.io", "without a scheme"),
])
def test_calico_variables_are_checked(name: str, value: Any, message: str) -> None:
    _, problem = check_value(load_variable_specs()[name], value)
    assert problem is not None and message in problem.message


def test_block_larger_than_the_pod_range_is_refused() -> None:
    problems = check_combination(default_vars(cni="calico", pod_cidr="10.244.0.0/24",
                                              calico_block_size=22))
    assert [p.key for p in problems] == ["calico_block_size"]
    assert "larger than pod_cidr 10.244.0.0/24" in problems[0].message
    assert not check_combination(default_vars(cni="flannel", pod_cidr="10.244.0.0/24",
                                              calico_block_size=22))
