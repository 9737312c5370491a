"""gpu_monitoring (issue 19, part 3): the DCGM exporter and Prometheus manifests, the scrape
targets gpuk8s writes from its inventory, turning it off, and reading Prometheus' answers
(untrusted data) for `invoke gpu-usage` and `invoke status`."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from gpuk8s.day2 import gpuusage
from gpuk8s.errors import Gpuk8sError
from gpuk8s.facts import HostFacts
from gpuk8s.facts.kube import Cluster, ClusterState
from gpuk8s.roles import HostContext, load_role
from roles.monitoring import role as monitoring
from tests.unit.scenarios import default_vars

NODES = {"cp-01": {"name": "cp-01", "address": "10.88.0.11", "gpus": 0},
         "gpu-01": {"name": "gpu-01", "address": "10.88.0.12", "gpus": 2},
         "gpu-v6": {"name": "gpu-v6", "address": "fd00::12", "gpus": 1}}


def _plan(managed: dict[str, str] | None = None, **vars: Any) -> list[Any]:
    facts = HostFacts("cp-01", {Cluster(): ClusterState(True, "", {}, managed or {})})
    ctx = HostContext("cp-01", "monitoring", default_vars(**vars), facts, {"nodes": NODES},
                      ("control_plane",))
    return load_role("monitoring").plan(ctx)


def test_off_by_default_and_nothing_to_remove() -> None:
    (op,) = _plan()
    assert not op.changes and op.reason == "= gpu_monitoring is off"


def test_on_applies_exporter_and_prometheus_then_waits_for_both() -> None:
    (op,) = _plan(gpu_monitoring=True)
    script = op.commands[0]
    docs = [d for d in yaml.safe_load_all(script.split("\n", 1)[1].rsplit("\n", 2)[0]) if d]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("DaemonSet", "dcgm-exporter"), ("Deployment", "prometheus"),
            ("Service", "prometheus"), ("ConfigMap", "prometheus-config")} <= kinds
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    # security review 2, L4: the exporter is in its pod's network, no port on the nodes
    assert "hostNetwork" not in pod and "dnsPolicy" not in pod
    assert pod["runtimeClassName"] == "nvidia"
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["DCGM_EXPORTER_LISTEN"]["value"] == ":9400"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    headless = next(d for d in docs if d["kind"] == "Service" and
                    d["metadata"]["name"] == "dcgm-exporter")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"] == {"app.kubernetes.io/name": "dcgm-exporter"}
    # finding the exporters takes no API access: Prometheus' rules are the kubelet's only
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]},
        {"nonResourceURLs": ["/metrics", "/metrics/resource"], "verbs": ["get"]}]
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding")]
    assert pod["containers"][0]["image"] == \
        "nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless"
    prom = next(d for d in docs if d["kind"] == "Deployment")
    assert prom["spec"]["template"]["spec"]["containers"][0]["image"] == \
        "quay.io/prometheus/prometheus:v3.5.0"
    assert "rollout status deployment/prometheus" in op.commands[1]
    assert "rollout status daemonset/dcgm-exporter" in op.commands[1]


def test_scrape_targets_are_the_exporter_pods_and_every_kubelet() -> None:
    config = json.loads(monitoring.prometheus_config(NODES, 15, "lab.x"))
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    # the exporter pods' IPs from their headless Service, never a node address
    assert "static_configs" not in jobs["dcgm-exporter"]
    assert jobs["dcgm-exporter"]["dns_sd_configs"] == [
        {"names": ["dcgm-exporter.gpuk8s-monitoring.svc.lab.x"], "type": "A", "port": 9400,
         "refresh_interval": "15s"}]
    assert jobs["dcgm-exporter"]["metric_relabel_configs"] == [
        {"source_labels": ["Hostname"], "target_label": "node"}]
    assert [c["labels"]["node"] for c in jobs["kubelet"]["static_configs"]] == \
        ["cp-01", "gpu-01", "gpu-v6"]
    assert jobs["kubelet"]["metrics_path"] == "/metrics/resource"
    assert config["global"]["scrape_interval"] == "15s"


def test_turned_off_again_its_objects_are_deleted() -> None:
    managed = {"Namespace//gpuk8s-monitoring": "x",
               "ClusterRole//gpuk8s-prometheus": "y"}
    (op,) = _plan(managed)
    assert op.changes and "delete namespace gpuk8s-monitoring" in op.commands[0]


@pytest.mark.parametrize("value, message", [
    ({"dcgm_exporter_version": "4.5.3"}, "must be <DCGM>-<exporter>"),
    ({"prometheus_retention": "7 days"}, "must be a Prometheus duration"),
    ({"prometheus_version": "v3.5.0"}, "written without the v"),
])
def test_bad_versions_are_refused(value: dict[str, str], message: str) -> None:
    rules = load_role("monitoring").rules()
    (name, v), = value.items()
    rule = rules[name]
    assert rule.check is not None
    problem = rule.check(name, v)
    assert problem is not None and message in problem.message


class _Session:
    first_cp = "cp-01"

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.scripts: list[str] = []

    def run(self, host: str, op: Any) -> str:
        self.scripts.append(op.commands[0])
        return self.answer


def _answer(result: Any) -> str:
    return json.dumps({"status": "success", "data": {"resultType": "vector",
                                                      "result": result}})


def test_a_query_goes_through_the_service_proxy_url_encoded() -> None:
    s = _Session(_answer([]))
    assert gpuusage.query(s, "avg by (node) (DCGM_FI_DEV_GPU_UTIL)") == []  # type: ignore[arg-type]
    assert s.scripts[0].endswith(
        "get --raw '/api/v1/namespaces/gpuk8s-monitoring/services/http:prometheus:9090/proxy/"
        "api/v1/query?query=avg+by+%28node%29+%28DCGM_FI_DEV_GPU_UTIL%29'")


def test_prometheus_answers_are_data() -> None:
    good = {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "1", "node": "gpu-01",
                       "modelName": "NVIDIA H100 80GB HBM3", "pod": "train-0",
                       "namespace": "default"}, "value": [1.0, "37"]}
    odd = [{"metric": {"gpu": "0", "node": "[red]x[/red]"}, "value": [1.0, "NaN-ish"]},
           {"metric": "not a mapping", "value": [1, "1"]}, "junk"]
    s = _Session(_answer([good, *odd]))
    samples = gpuusage.query(s, "DCGM_FI_DEV_GPU_UTIL")  # type: ignore[arg-type]
    assert samples == [{"metric": good["metric"], "value": 37.0}]
    rows = gpuusage.usage_rows({"util": samples})
    assert rows[0]["pods"] == ["default/train-0"] and rows[0]["util"] == 37.0
    with pytest.raises(Gpuk8sError, match="not a query result"):
        gpuusage.query(_Session("<html>"), "up")  # type: ignore[arg-type]
