"""Kubernetes upgrades (`invoke upgrade --kubernetes`) against the booted lab: a 3-node cluster
(cp-01, gpu-01, cpu-01) bootstrapped at Kubernetes 1.35 (the lab's pkgs.k8s.io mirror has a
repo per minor: v1.35 with 1.35.4, v1.36 with 1.36.1 and 1.36.2), moved to the next minor
(1.36.1, the repo moved, kubeadm's order, a worker at a time), then to a patch release (1.36.2,
both workers in one batch). Both go through the runner's upgrade phases.

The lab's kubeadm stand-in implements `upgrade apply/node` with kubeadm's version policy and
messages; `apply` rewrites the static pod manifests, and the kubelet stand-in restarts the API
server stand-in at the new tag (its /version then says so). The tests run in order and share
one bootstrap from the "fresh" snapshot.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s import day2
from gpuk8s.errors import Gpuk8sError, InventoryError
from gpuk8s.ops.kube import KUBEADM_CONFIG, KUBEADM_IMAGES
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
OLD, MINOR, PATCH = "1.35.4", "1.36.1", "1.36.2"
REPO_LIST = "/etc/apt/sources.list.d/kubernetes.list"


@pytest.fixture(scope="module")
def up_lab(lab: Lab) -> Lab:
    return restore_fresh(lab)


@pytest.fixture(scope="module")
def at_135(up_lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The inventory the cluster was built from: Kubernetes 1.35."""
    return cut_inventory(up_lab, tmp_path_factory.mktemp("k8s-135"), NODES,
                         kubernetes_version="1.35")


def variant(inventory: Path, name: str, **variables: Any) -> Path:
    data = yaml.safe_load(inventory.read_text())
    data["all"]["vars"].update(variables)
    path = inventory.parent / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def at_old(up_lab: Lab, at_135: Path) -> Lab:
    result, text = bootstrap_inline(at_135)
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
            "packages": pkgs,
            "repos": {n: ssh_ok(lab, n, f"grep -o '/v1\\.[0-9]*/' {REPO_LIST} | sort -u").strip()
                      for n in NODES}}


def at(lab: Lab, release: str) -> None:
    """Every node, the API server and the control plane's records at ``release``."""
    v = versions(lab)
    minor = ".".join(release.split(".")[:2])
    assert v["server"] == f"v{release}"
    assert v["kubelets"] == dict.fromkeys(NODES, f"v{release}")
    assert v["cordoned"] == []
    assert v["repos"] == dict.fromkeys(NODES, f"/v{minor}/")
    for node, pkgs in v["packages"].items():
        assert pkgs == [f"kubeadm={release}-1.1", f"kubectl={release}-1.1",
                        f"kubelet={release}-1.1"], node
        held = ssh_ok(lab, node, "apt-mark showhold").split()
        assert {"kubeadm", "kubelet", "kubectl"} <= set(held), (node, held)


#: on cp-01 while an upgrade runs: the cordoned nodes every 0.25 s ("t name name ...")
POLLER = (f"while :; do c=$({KUBECTL} get nodes -o jsonpath='{{range .items[*]}}"
          "{.metadata.name}={.spec.unschedulable} {end}' 2>/dev/null) && "
          "echo \"$(date +%s.%N) $c\"; sleep 0.25; done")


def cordoned_while(lab: Lab, run: Any) -> tuple[Any, list[set[str]]]:
    """``run()``'s result and, for each poll that got an answer, the set of cordoned nodes."""
    ssh_ok(lab, "cp-01", f"nohup sh -c {shlex.quote(POLLER)} >/tmp/cordon.log 2>&1 & "
           "echo $! >/tmp/cordon.pid")
    try:
        result = run()
    finally:
        ssh_ok(lab, "cp-01", "kill $(cat /tmp/cordon.pid)")
    polls = [{w.split("=")[0] for w in line.split()[1:] if w.endswith("=true")}
             for line in ssh_ok(lab, "cp-01", "cat /tmp/cordon.log").splitlines()
             if line[:1].isdigit()]
    return result, polls


def test_cluster_starts_at_1_35(at_old: Lab) -> None:
    at(at_old, OLD)


@pytest.mark.parametrize(("version", "error", "message"), [
    ("latest", InventoryError, "is not a Kubernetes release"),
    ("1.37", InventoryError, r"(?s)one minor release at a time.*--kubernetes 1\.36` first"),
    ("1.34", InventoryError, r"the cluster runs v1\.35\.4, newer than 1\.34"),
    ("1.36.9", InventoryError, r"(?s)no kubeadm 1\.36\.9 in .*/v1\.36/.*it offers: 1\.36\.2-1\.1, "
                               r"1\.36\.1-1\.1"),
])
def test_bad_targets_are_refused_before_any_change(at_old: Lab, at_135: Path, version: str,
                                                   error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call(day2.upgrade, at_135, kubernetes=version, yes=True)
    at(at_old, OLD)


def test_a_pinned_inventory_is_refused_with_the_fix(at_old: Lab, at_135: Path) -> None:
    pinned = variant(at_135, "pinned", kubernetes_package_version=f"{OLD}-1.1")
    with pytest.raises(InventoryError) as err:
        call(day2.upgrade, pinned, kubernetes="1.36", yes=True)
    text = str(err.value)
    assert f"kubernetes_package_version pins {OLD}-1.1" in text and "pinned.yaml" in text
    assert 'kubernetes_package_version: ""' in text


def test_workers_cannot_go_first(at_old: Lab, at_135: Path) -> None:
    with pytest.raises(Gpuk8sError, match=r"the control plane cp-01 runs v1\.35\.4; it must be "
                       r"upgraded before any worker"):
        call(day2.upgrade, at_135, kubernetes="1.36", limit="gpu-01", yes=True)
    at(at_old, OLD)


def test_next_minor_control_plane_first_then_one_worker_at_a_time(
        at_old: Lab, at_135: Path) -> None:
    (result, text), polls = cordoned_while(at_old, lambda: call(
        day2.upgrade, at_135, kubernetes=MINOR, serial=1, yes=True))
    assert result["upgraded"] == ["cp-01", "gpu-01", "cpu-01"]
    # each node was seen cordoned, and never two workers at once (--serial 1)
    print(f"{len(polls)} polls of the nodes during the upgrade")
    assert len(polls) > 20 and {"cp-01", "gpu-01", "cpu-01"} <= set().union(*polls), polls
    assert max(len(p - {"cp-01"}) for p in polls) == 1, polls
    order = [text.index(s) for s in (
        "== upgrade-first-control-plane", "backup: ", "drain cp-01",
        "-> kubernetes_upgrade | kubeadm upgrade apply", "cp-01 Ready", "== upgrade-workers",
        "drain gpu-01", "-> kubernetes_upgrade | kubeadm upgrade node",
        "gpu-01 Ready, 2 GPU(s) allocatable", "uncordon gpu-01", "drain cpu-01", "cpu-01 Ready",
        "== upgrade-config")]
    assert order == sorted(order), text
    at(at_old, MINOR)
    # the control plane's static pods, kubeadm's record and gpuk8s's kubeadm config moved too
    image = ssh_ok(at_old, "cp-01", f"{KUBECTL} -n kube-system get pod kube-apiserver-cp-01 "
                   "-o jsonpath='{.spec.containers[0].image}'")
    assert image == f"registry.k8s.io/kube-apiserver:v{MINOR}"
    cc = ssh_ok(at_old, "cp-01", f"{KUBECTL} -n kube-system get configmap kubeadm-config "
                "-o jsonpath='{.data.ClusterConfiguration}'")
    assert f"kubernetesVersion: v{MINOR}" in cc
    config = ssh_ok(at_old, "cp-01", f"grep '^kubernetesVersion:' {KUBEADM_CONFIG}").strip()
    assert config == f'kubernetesVersion: "v{MINOR}"'
    # containerd's sandbox image is the pause kubeadm 1.36 expects, no longer 1.35's
    pause = {v: f"registry.k8s.io/pause:{KUBEADM_IMAGES[v][1]}" for v in ("1.35", "1.36")}
    assert pause["1.35"] != pause["1.36"]
    for node in NODES:
        toml = ssh_ok(at_old, node, "cat /etc/containerd/config.toml")
        assert pause["1.36"] in toml and pause["1.35"] not in toml, node
    # the inventory still says 1.35: the one line to change, where
    line = result["inventory_change"]
    assert line.startswith('now write kubernetes_version: "1.36" in ') and "k8s-135" in line
    assert line in text


def test_a_stale_inventory_plans_no_downgrade_and_says_what_to_write(
        at_old: Lab, at_135: Path, tmp_path: Path) -> None:
    plan = Bootstrap(at_135, tmp_path / "runs", command="plan")
    assert plan.finish() == 0, plan.stderr
    out = plan.stdout
    assert "plan: 0 change(s)" in out, out[-3000:]
    assert "never downgrades a cluster" in out and 'write kubernetes_version: "1.36"' in out
    # a second run of the same upgrade changes nothing, and says the line again
    result, text = call(day2.upgrade, at_135, kubernetes=MINOR, yes=True)
    assert result["upgraded"] == [] and "nothing to upgrade" in text
    assert result["inventory_change"].startswith('now write kubernetes_version: "1.36"')
    at(at_old, MINOR)


def test_a_patch_release_with_both_workers_in_one_batch(at_old: Lab, at_135: Path) -> None:
    at_136 = variant(at_135, "at-136", kubernetes_version="1.36")
    (result, text), polls = cordoned_while(at_old, lambda: call(
        day2.upgrade, at_136, kubernetes=PATCH, serial=2, yes=True))
    assert result["upgraded"] == ["cp-01", "gpu-01", "cpu-01"]
    assert {"gpu-01", "cpu-01"} in polls, polls  # both workers out at once
    assert result["inventory_change"] == ""
    workers = text[text.index("== upgrade-workers"):]
    # one batch: both drained before either is waited for
    assert max(workers.index("drain gpu-01"), workers.index("drain cpu-01")) < \
        min(workers.index("gpu-01 Ready"), workers.index("cpu-01 Ready")), text
    at(at_old, PATCH)


def test_after_the_upgrades_plan_is_clean_and_upgrade_is_a_noop(
        at_old: Lab, at_135: Path, tmp_path: Path) -> None:
    at_136 = at_135.parent / "at-136.yaml"
    plan = Bootstrap(at_136, tmp_path / "runs", command="plan")
    assert plan.finish() == 0, plan.stderr
    assert "plan: 0 change(s)" in plan.stdout, plan.stdout[-3000:]
    assert "differs from the inventory" not in plan.stdout
    assert "never downgrades" not in plan.stdout
    result, text = call(day2.upgrade, at_136, kubernetes=PATCH, yes=True)
    assert result["upgraded"] == [] and "nothing to upgrade" in text
    at(at_old, PATCH)
