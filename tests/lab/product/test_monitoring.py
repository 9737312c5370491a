"""gpu_monitoring on the bootstrapped lab (issue 19's acceptance, part 3): the DCGM exporter
(a lab stand-in serving the exporter's real metric names from the nvidia-smi stand-in) on both
GPU nodes and the REAL Prometheus (Debian's build, in a lab image, run as a pod by the nodes'
containerd) scraping them. A query through Prometheus' HTTP API returns DCGM_FI_DEV_GPU_UTIL for
all 3 lab GPUs with node labels; `invoke status` and `invoke gpu-usage` show them; turning it
off removes it. The tests run in order on one cluster."""

from __future__ import annotations

import ipaddress
import json
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import day2
from tests.lab import images, registry
from tests.lab.lab import Lab
from tests.lab.paths import node_ip
from tests.lab.product.runs import bootstrap_inline, call, derived_inventory, ssh_ok
from tests.lab.product.test_bootstrap import GATE_VARS
from tests.lab.product.test_day2 import restore_bootstrapped

pytestmark = pytest.mark.lab
KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf"
BUSYBOX = "docker.io/library/busybox:gpuk8s-lab"
PROXY = "/api/v1/namespaces/gpuk8s-monitoring/services/http:prometheus:9090/proxy"


@pytest.fixture(scope="module")
def cluster(lab: Lab) -> Lab:
    images.push_prometheus()
    registry.push_busybox()
    return restore_bootstrapped(lab)


def inventory(lab: Lab, dest: Path, on: bool) -> Path:
    return derived_inventory(lab, dest, feature_gates=GATE_VARS, gpu_monitoring=on,
                             prometheus_scrape_interval=2,
                             prometheus_version=images.PROMETHEUS_LAB_VERSION)


def query(lab: Lab, promql: str) -> list[dict[str, Any]]:
    url = f"{PROXY}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    body = json.loads(ssh_ok(lab, "cp-01", f"{KUBECTL} get --raw '{url}'"))
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def test_gpu_monitoring_scrapes_every_lab_gpu(cluster: Lab, tmp_path: Path) -> None:
    result, text = bootstrap_inline(inventory(cluster, tmp_path, True))
    assert all(t["failed"] == 0 for t in result["totals"].values()), text
    assert "wait until Prometheus and every exporter are ready" in text, text
    # the real Prometheus, answering through the API server's service proxy
    build = json.loads(ssh_ok(cluster, "cp-01", f"{KUBECTL} get --raw "
                              f"'{PROXY}/api/v1/status/buildinfo'"))
    # Debian's build says so: "2.42.0+ds"
    assert build["data"]["version"].split("+")[0] == images.PROMETHEUS_LAB_VERSION, build
    deadline = time.monotonic() + 90
    series: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        series = query(cluster, "DCGM_FI_DEV_GPU_UTIL")
        if len(series) == 3:
            break
        time.sleep(2)
    per_node = sorted((s["metric"]["node"], s["metric"]["gpu"]) for s in series)
    assert per_node == [("gpu-01", "0"), ("gpu-01", "1"), ("gpu-02", "0")], series
    models = {s["metric"]["node"]: s["metric"]["modelName"] for s in series}
    assert models == {"gpu-01": "NVIDIA H100 80GB HBM3", "gpu-02": "NVIDIA H200"}
    targets = json.loads(ssh_ok(cluster, "cp-01", f"{KUBECTL} get --raw "
                                f"'{PROXY}/api/v1/targets'"))["data"]["activeTargets"]
    # the exporter pods, found through their headless Service's DNS name: pod IPs in the
    # nodes' pod CIDRs, never a node address (security review 2, L4)
    dcgm = [t for t in targets if t["labels"]["job"] == "dcgm-exporter"]
    assert [t["health"] for t in dcgm] == ["up", "up"], targets
    nodes = json.loads(ssh_ok(cluster, "cp-01", f"{KUBECTL} get nodes -o json"))["items"]
    node_ips = {a["address"] for n in nodes for a in n["status"]["addresses"]}
    cidrs = [ipaddress.ip_network(n["spec"]["podCIDR"]) for n in nodes]
    for t in dcgm:
        host = t["scrapeUrl"].split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[0]
        assert host not in node_ips and any(ipaddress.ip_address(host) in c for c in cidrs), t
    # and nothing answers on a GPU node's own address at the exporter's port
    rc, out, err = cluster.ssh("cp-01", "curl -s -m 5 -o /dev/null -w '%{http_code}' "
                               f"http://{node_ip(2)}:9400/metrics")  # gpu-01
    assert rc != 0 and out in ("", "000"), (rc, out, err)
    again, text = bootstrap_inline(inventory(cluster, tmp_path, True))
    assert again["changed"] == 0, text


def test_status_and_gpu_usage_show_utilisation(cluster: Lab, tmp_path: Path) -> None:
    inv = inventory(cluster, tmp_path, True)
    rows, text = call(day2.gpu_usage, inv)
    assert [(r["node"], r["gpu"]) for r in rows] == [("gpu-01", "0"), ("gpu-01", "1"),
                                                     ("gpu-02", "0")], text
    assert all(r["util"] is not None and r["used"] is not None for r in rows), rows
    # the model is a wide column (the default view fits 80 columns)
    _rows, wide = call(day2.gpu_usage, inv, wide=True)
    assert "NVIDIA H200" in wide and "NVIDIA H200" not in text
    status, text = call(day2.status, inv)
    util = {r["host"]: r.get("gpu_util") for r in status}
    assert util["gpu-01"] is not None and util["gpu-02"] is not None, text
    assert all(isinstance(util[h], float) and 0 <= util[h] <= 100 for h in ("gpu-01", "gpu-02"))
    assert "gpu_util" not in next(r for r in status if r["host"] == "cpu-01")


def test_gpu_usage_names_the_pod_holding_a_gpu(cluster: Lab, tmp_path: Path) -> None:
    pod = json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "holder", "namespace": "default"}, "spec": {
        "nodeSelector": {"kubernetes.io/hostname": "gpu-02"}, "runtimeClassName": "nvidia",
        "restartPolicy": "Never", "containers": [{
            "name": "c", "image": BUSYBOX, "command": ["/bin/busybox", "sleep", "300"],
            "resources": {"limits": {"nvidia.com/gpu": 1}}}]}})
    ssh_ok(cluster, "cp-01", f"{KUBECTL} apply -f - <<'EOF'\n{pod}\nEOF")
    inv = inventory(cluster, tmp_path, True)
    deadline = time.monotonic() + 90
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        rows, _ = call(day2.gpu_usage, inv)
        if any(r["pods"] for r in rows):
            break
        time.sleep(3)
    # the exporter names the pod from the kubelet's allocation (pod-resources)
    assert [(r["node"], r["pods"]) for r in rows if r["pods"]] == \
        [("gpu-02", ["default/holder"])], rows
    ssh_ok(cluster, "cp-01", f"{KUBECTL} delete pod holder --wait=true", timeout=180)


def test_verify_checks_a_dcgm_series_per_gpu(cluster: Lab, tmp_path: Path) -> None:
    from gpuk8s import workloads

    result = workloads.verify(inventory(cluster, tmp_path, True), sets=["tensorflow=false"])
    assert {n: (v["dcgm"], v["ok"]) for n, v in result["nodes"].items()} == {
        "gpu-01": (2, True), "gpu-02": (1, True)}, result


def test_turned_off_it_is_removed(cluster: Lab, tmp_path: Path) -> None:
    _, text = bootstrap_inline(inventory(cluster, tmp_path, False))
    assert "delete namespace gpuk8s-monitoring" in text, text
    rc, out, _ = cluster.ssh("cp-01", f"{KUBECTL} get namespace gpuk8s-monitoring")
    assert rc != 0 or "Terminating" in out
    again, text = bootstrap_inline(inventory(cluster, tmp_path, False))
    assert again["changed"] == 0, text
