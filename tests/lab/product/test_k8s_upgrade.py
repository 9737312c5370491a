"""Kubernetes patch upgrade (`invoke upgrade --kubernetes`) against the booted lab: a 3-node
cluster (cp-01, gpu-01, cpu-01) bootstrapped at 1.36.1 (the inventory pins
kubernetes_package_version: "1.36.1-1.1"; the lab's pkgs.k8s.io mirror also has 1.36.2), then
moved to 1.36.2 with kubeadm, the control plane first and the workers one at a time.

The lab's kubeadm stand-in implements `upgrade apply/node` with kubeadm's version policy
and messages; `apply` rewrites the static pod manifests, and the kubelet stand-in restarts the
API server stand-in at the new tag (its /version then says so). The tests run in order and
share one bootstrap from the "fresh" snapshot.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s import day2
from gpuk8s.errors import Gpuk8sError, InventoryError
from tests.lab.lab import Lab
from tests.lab.product.runs import (
    Bootstrap,
    bootstrap_inline,
    call,
    cut_inventory,
    restore_fresh,
    ssh_ok,
)

pytestmark = pytest.mark.lab

NODES = ("cp-01", "gpu-01", "cpu-01")
KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf"
OLD, NEW = "1.36.1", "1.36.2"


@pytest.fixture(scope="module")
def up_lab(lab: Lab) -> Lab:
    return restore_fresh(lab)


@pytest.fixture(scope="module")
def pinned(up_lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The inventory the cluster was built from: pinned at 1.36.1."""
    return cut_inventory(up_lab, tmp_path_factory.mktemp("k8s-pinned"), NODES,
                         kubernetes_package_version=f"{OLD}-1.1")


@pytest.fixture(scope="module")
def unpinned(pinned: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same inventory after the admin lifts the pin (newest 1.36 patch)."""
    data = yaml.safe_load(pinned.read_text())
    data["all"]["vars"]["kubernetes_package_version"] = ""
    path = tmp_path_factory.mktemp("k8s-unpinned") / "inventory.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def at_old(up_lab: Lab, pinned: Path) -> Lab:
    result, text = bootstrap_inline(pinned)
    assert all(t["failed"] == 0 for t in result["totals"].values()), text
    return up_lab


def versions(lab: Lab) -> dict[str, Any]:
    nodes = json.loads(ssh_ok(lab, "cp-01", f"{KUBECTL} get nodes -o json"))["items"]
    server = json.loads(ssh_ok(lab, "cp-01", f"{KUBECTL} version -o json"))
    pkgs = {n: sorted(ssh_ok(lab, n, "dpkg-query -W -f '${Package}=${Version} ' kubeadm "
                             "kubelet kubectl").split()) for n in NODES}
    return {"server": server["serverVersion"]["gitVersion"],
            "kubelets": {n["metadata"]["name"]: n["status"]["nodeInfo"]["kubeletVersion"]
                         for n in nodes},
            "cordoned": sorted(n["metadata"]["name"] for n in nodes
                               if n["spec"].get("unschedulable")),
            "packages": pkgs}


def test_cluster_starts_at_the_pinned_release(at_old: Lab) -> None:
    v = versions(at_old)
    assert v["server"] == f"v{OLD}"
    assert v["kubelets"] == dict.fromkeys(NODES, f"v{OLD}")
    for node, pkgs in v["packages"].items():
        assert pkgs == [f"kubeadm={OLD}-1.1", f"kubectl={OLD}-1.1", f"kubelet={OLD}-1.1"], node


@pytest.mark.parametrize(("version", "message"), [
    ("1.36", "is not a Kubernetes release"),
    ("1.37.0", "is not a 1.36 release"),
])
def test_bad_targets_are_refused_before_any_change(at_old: Lab, unpinned: Path, version: str,
                                                   message: str) -> None:
    with pytest.raises(InventoryError, match=message):
        call(day2.upgrade, unpinned, kubernetes=version, yes=True)
    assert versions(at_old)["server"] == f"v{OLD}"


def test_a_pinned_inventory_is_refused_with_the_fix(at_old: Lab, pinned: Path) -> None:
    with pytest.raises(InventoryError) as err:
        call(day2.upgrade, pinned, kubernetes=NEW, yes=True)
    text = str(err.value)
    assert f"kubernetes_package_version pins {OLD}-1.1" in text and "inventory.yaml" in text
    assert 'kubernetes_package_version: ""' in text
    assert versions(at_old)["packages"]["cp-01"][0] == f"kubeadm={OLD}-1.1"


def test_workers_cannot_go_first(at_old: Lab, unpinned: Path) -> None:
    with pytest.raises(Gpuk8sError, match=r"the control plane cp-01 runs v1\.36\.1; it must be "
                       r"upgraded before any worker"):
        call(day2.upgrade, unpinned, kubernetes=NEW, limit="gpu-01", yes=True)
    assert versions(at_old)["kubelets"]["gpu-01"] == f"v{OLD}"


def test_a_release_missing_from_the_repo_stops_at_once(at_old: Lab, unpinned: Path) -> None:
    with pytest.raises(Gpuk8sError) as err:
        call(day2.upgrade, unpinned, kubernetes="1.36.9", yes=True)
    text = str(err.value)
    assert "upgrade stopped at cp-01" in text and "no kubeadm 1.36.9 in the configured repos" \
        in text and "untouched: gpu-01, cpu-01" in text
    v = versions(at_old)
    assert v["server"] == f"v{OLD}" and v["cordoned"] == []
    assert v["packages"]["cp-01"][0] == f"kubeadm={OLD}-1.1"
    held = ssh_ok(at_old, "cp-01", "apt-mark showhold").split()
    assert "kubeadm" in held


def test_upgrade_control_plane_first_then_one_worker_at_a_time(at_old: Lab,
                                                                unpinned: Path) -> None:
    result, text = call(day2.upgrade, unpinned, kubernetes=NEW, serial=1, yes=True)
    assert result["upgraded"] == ["cp-01", "gpu-01", "cpu-01"]
    order = [text.index(s) for s in (
        f"[cp-01] kubeadm upgrade apply v{NEW}", "[cp-01] Ready at", "[gpu-01] kubeadm upgrade "
        "node", "drain gpu-01", "[gpu-01] Ready at v1.36.2, 2 GPU(s) allocatable",
        "[cpu-01] kubeadm upgrade node", "[cpu-01] Ready at")]
    assert order == sorted(order), text
    v = versions(at_old)
    assert v["server"] == f"v{NEW}"
    assert v["kubelets"] == dict.fromkeys(NODES, f"v{NEW}")
    assert v["cordoned"] == []
    for node, pkgs in v["packages"].items():
        assert pkgs == [f"kubeadm={NEW}-1.1", f"kubectl={NEW}-1.1", f"kubelet={NEW}-1.1"], node
        held = ssh_ok(at_old, node, "apt-mark showhold").split()
        assert {"kubeadm", "kubelet", "kubectl"} <= set(held), (node, held)
    # the control plane's static pods and kubeadm's record of the cluster moved too
    image = ssh_ok(at_old, "cp-01", f"{KUBECTL} -n kube-system get pod kube-apiserver-cp-01 "
                   "-o jsonpath='{.spec.containers[0].image}'")
    assert image == f"registry.k8s.io/kube-apiserver:v{NEW}"
    cc = ssh_ok(at_old, "cp-01", f"{KUBECTL} -n kube-system get configmap kubeadm-config "
                "-o jsonpath='{.data.ClusterConfiguration}'")
    assert f"kubernetesVersion: v{NEW}" in cc
    gpus = ssh_ok(at_old, "cp-01", f"{KUBECTL} get node gpu-01 -o "
                  "jsonpath='{.status.allocatable.nvidia\\.com/gpu}'")
    assert gpus == "2"


def test_after_the_upgrade_plan_is_clean_and_upgrade_is_a_noop(
        at_old: Lab, unpinned: Path, tmp_path: Path) -> None:
    plan = Bootstrap(unpinned, tmp_path / "runs", command="plan")
    assert plan.finish() == 0, plan.stderr
    assert "plan: 0 change(s)" in plan.stdout, plan.stdout[-3000:]
    assert "differs from the inventory" not in plan.stdout
    result, text = call(day2.upgrade, unpinned, kubernetes=NEW, yes=True)
    assert result["upgraded"] == [] and "nothing to upgrade" in text
