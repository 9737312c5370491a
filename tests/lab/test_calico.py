"""cni: calico against the booted lab: a 2-node cluster (cp-01, gpu-01) whose pod network is
gpuk8s's pinned Calico manifest (CRDs, RBAC, calico-node DaemonSet, calico-kube-controllers).

The lab's kubelet stand-in plays calico/cni's install-cni init container: it writes the CNI
config from the ConfigMap key the container's env names, so a wrong or missing ConfigMap leaves
the nodes NotReady. The tests run in order and share one bootstrap from the "fresh" snapshot.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuk8s.errors import PlanError
from tests.lab.lab import Lab
from tests.lab.runs import bootstrap_inline, cut_inventory, restore_fresh, ssh_ok

pytestmark = pytest.mark.lab

NODES = ("cp-01", "gpu-01")
KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf"


@pytest.fixture(scope="module")
def calico_lab(lab: Lab) -> Lab:
    return restore_fresh(lab)


@pytest.fixture(scope="module")
def inventory(calico_lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cut_inventory(calico_lab, tmp_path_factory.mktemp("calico"), NODES, cni="calico",
                         pod_cidr="10.50.0.0/16")


@pytest.fixture(scope="module")
def first_run(calico_lab: Lab, inventory: Path) -> tuple[dict[str, Any], str]:
    return bootstrap_inline(inventory)


def test_bootstrap_with_calico_succeeds(first_run: tuple[dict[str, Any], str]) -> None:
    result, text = first_run
    assert sorted(result["totals"]) == sorted(NODES), result["totals"]
    assert all(t["failed"] == 0 for t in result["totals"].values()), text
    assert "cni | calico" in text and "cni | flannel" not in text


def test_nodes_ready_with_calico_cni_config(calico_lab: Lab, first_run: Any) -> None:
    ssh_ok(calico_lab, "cp-01", f"{KUBECTL} wait --for=condition=Ready node/cp-01 node/gpu-01 "
           "--timeout=180s", timeout=240)
    for node in NODES:
        listing = ssh_ok(calico_lab, node, "ls /etc/cni/net.d").split()
        assert listing == ["10-calico.conflist"], (node, listing)
        conf = json.loads(ssh_ok(calico_lab, node, "cat /etc/cni/net.d/10-calico.conflist"))
        calico = conf["plugins"][0]
        assert calico["type"] == "calico" and calico["nodename"] == node, conf
        assert calico["ipam"] == {"type": "calico-ipam"} and calico["mtu"] == 1450, conf
    # kubeadm's podSubnet and Calico's pool are the same range
    cm = ssh_ok(calico_lab, "cp-01", f"{KUBECTL} -n kube-system get configmap kubeadm-config "
                "-o jsonpath='{.data.ClusterConfiguration}'")
    assert "podSubnet: 10.50.0.0/16" in cm, cm
    ds = json.loads(ssh_ok(calico_lab, "cp-01", f"{KUBECTL} -n kube-system get daemonset "
                           "calico-node -o json"))
    env = {e["name"]: e.get("value") for e in ds["spec"]["template"]["spec"]["containers"][0]
           ["env"]}
    assert env["CALICO_IPV4POOL_CIDR"] == "10.50.0.0/16"


def test_calico_objects_and_gpus(calico_lab: Lab, first_run: Any) -> None:
    crds = ssh_ok(calico_lab, "cp-01", f"{KUBECTL} get customresourcedefinitions -o name")
    assert "customresourcedefinition.apiextensions.k8s.io/ippools.crd.projectcalico.org" \
        in crds.split(), crds
    pods = json.loads(ssh_ok(calico_lab, "cp-01", f"{KUBECTL} -n kube-system get pods "
                             "-l k8s-app=calico-node -o json"))["items"]
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(NODES), pods
    ssh_ok(calico_lab, "cp-01", f"{KUBECTL} -n kube-system get deployment "
           "calico-kube-controllers")
    # pods get sandboxes through Calico's CNI config: the device plugin runs, GPUs advertised
    ssh_ok(calico_lab, "cp-01", f"{KUBECTL} wait --for=jsonpath='{{.status.allocatable."
           "nvidia\\.com/gpu}'=2 node/gpu-01 --timeout=180s", timeout=240)


def test_second_bootstrap_changes_nothing(inventory: Path, first_run: Any) -> None:
    result, text = bootstrap_inline(inventory)
    assert all(t["failed"] == 0 for t in result["totals"].values()), text
    assert result["changed"] == 0, text


def test_switching_to_flannel_is_refused_and_changes_nothing(
        calico_lab: Lab, inventory: Path, first_run: Any) -> None:
    before = ssh_ok(calico_lab, "cp-01", f"{KUBECTL} get daemonsets -A -o name")
    with pytest.raises(PlanError, match="the cluster runs calico, the inventory asks for "
                       "flannel"):
        bootstrap_inline(inventory, sets=["cni=flannel"])
    assert ssh_ok(calico_lab, "cp-01", f"{KUBECTL} get daemonsets -A -o name") == before
    assert "kube-flannel" not in before
