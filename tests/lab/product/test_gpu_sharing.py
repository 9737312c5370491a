"""gpu_sharing: time-slicing on one node of the bootstrapped lab (issue 19's acceptance, part 1).

gpu-02 (1 H200) gets {mode: time-slicing, replicas: 4}: it offers 4 nvidia.com/gpu, four 1-GPU
pods run there at once, a fifth is Pending with the scheduler's message; gpu-01 is unchanged.
Back to none converges and a second run is a no-op. The tests run in order on one cluster."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.lab import registry
from tests.lab.lab import Lab
from tests.lab.product.runs import bootstrap_inline, derived_inventory, ssh_ok
from tests.lab.product.test_day2 import restore_bootstrapped

pytestmark = pytest.mark.lab
KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf"
BUSYBOX = "docker.io/library/busybox:gpuk8s-lab"
SLICED = {"mode": "time-slicing", "replicas": 4}


@pytest.fixture(scope="module")
def cluster(lab: Lab) -> Lab:
    registry.push_busybox()
    return restore_bootstrapped(lab)


def inventory(lab: Lab, dest: Path, sharing: dict[str, Any] | None) -> Path:
    """The lab's inventory with gpu_sharing on gpu-02 (None: the default)."""
    return derived_inventory(lab, dest, {"gpu-02": {"gpu_sharing": sharing}})


def allocatable(lab: Lab, node: str) -> str:
    return ssh_ok(lab, "cp-01", f"{KUBECTL} get node {node} -o jsonpath="
                  "'{.status.allocatable.nvidia\\.com/gpu}'").strip()


def gpu_pod(name: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": "default", "labels": {"app": "sliced"}}, "spec": {
        "nodeSelector": {"kubernetes.io/hostname": "gpu-02"}, "runtimeClassName": "nvidia",
        "restartPolicy": "Never", "containers": [{
            "name": "c", "image": BUSYBOX, "command": ["/bin/busybox", "sleep", "300"],
            "resources": {"limits": {"nvidia.com/gpu": 1}}}]}})


def test_time_slicing_on_gpu_02_offers_four_and_leaves_gpu_01(cluster: Lab,
                                                              tmp_path: Path) -> None:
    result, text = bootstrap_inline(inventory(cluster, tmp_path, SLICED))
    assert all(t["failed"] == 0 for t in result["totals"].values()), text
    assert "gpu-02 offers 4 nvidia.com/gpu (1 GPU(s) x 4)" in text, text
    assert allocatable(cluster, "gpu-02") == "4"
    assert allocatable(cluster, "gpu-01") == "2"
    labels = json.loads(ssh_ok(cluster, "cp-01", f"{KUBECTL} get node gpu-02 -o json"))[
        "metadata"]["labels"]
    assert labels["nvidia.com/device-plugin.config"] == "time-slicing-4"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    again, text = bootstrap_inline(inventory(cluster, tmp_path, SLICED))
    assert again["changed"] == 0, text


def test_four_pods_share_the_h200_and_a_fifth_waits(cluster: Lab) -> None:
    for i in range(5):
        ssh_ok(cluster, "cp-01", f"{KUBECTL} apply -f -  <<'EOF'\n{gpu_pod(f's{i}')}\nEOF")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pods = json.loads(ssh_ok(cluster, "cp-01", f"{KUBECTL} get pods -l app=sliced -o json"
                                 ))["items"]
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        if len(running) == 4:
            break
        time.sleep(1)
    phases = {p["metadata"]["name"]: p["status"].get("phase") for p in pods}
    assert sorted(phases.values()) == ["Pending", "Running", "Running", "Running", "Running"]
    [pending] = [p for p in pods if p["status"].get("phase") == "Pending"]
    cond = next(c for c in pending["status"]["conditions"] if c["type"] == "PodScheduled")
    assert cond["message"].startswith("0/4 nodes are available: ") and \
        "Insufficient nvidia.com/gpu" in cond["message"], cond
    ssh_ok(cluster, "cp-01", f"{KUBECTL} delete pods -l app=sliced --wait=true", timeout=180)


def test_verify_counts_the_time_sliced_slots(cluster: Lab, tmp_path: Path) -> None:
    """`invoke verify` on the time-sliced cluster: gpu-02 offers 4 slots of its 1 GPU, and
    nvidia-smi in a pod there sees the one H200."""
    from gpuk8s import workloads

    result = workloads.verify(inventory(cluster, tmp_path, SLICED), sets=["tensorflow=false"])
    assert result["nodes"]["gpu-02"]["ok"] and result["nodes"]["gpu-01"]["ok"], result
    assert result["nodes"]["gpu-02"]["allocatable"] == 4
    assert result["nodes"]["gpu-02"]["nvidia_smi"] == 1


def test_back_to_none_converges_then_a_second_run_is_a_no_op(cluster: Lab,
                                                              tmp_path: Path) -> None:
    result, text = bootstrap_inline(inventory(cluster, tmp_path, None))
    assert all(t["failed"] == 0 for t in result["totals"].values()), text
    assert allocatable(cluster, "gpu-02") == "1" and allocatable(cluster, "gpu-01") == "2"
    again, text = bootstrap_inline(inventory(cluster, tmp_path, None))
    assert again["changed"] == 0, text
