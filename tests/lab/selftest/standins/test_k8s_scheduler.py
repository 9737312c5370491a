"""The scheduler stand-in's pure logic (standins/k8s/scheduler.py): where a pod fits, the real
FailedScheduling texts, resource requests, quantities and durations."""

from __future__ import annotations

from typing import Any

import pytest
from k8s import scheduler
from k8s.common import format_duration, parse_duration, parse_quantity

from tests.lab.selftest.standins.k8s_helpers import CP_TAINT, NEEDS_OPENSSL, Obj, gpu_pod

pytestmark = NEEDS_OPENSSL


def node_obj(name: str, gpus: int = 0, taints: list[Obj] | None = None, **kw: Any) -> Obj:
    alloc = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    if gpus:
        alloc["nvidia.com/gpu"] = str(gpus)
    return {"metadata": {"name": name, "labels": kw.get("labels", {})},
            "spec": {"taints": taints or [], "unschedulable": kw.get("unschedulable", False)},
            "status": {"allocatable": alloc}}


class TestScheduler:
    def test_gpu_fits(self) -> None:
        nodes = [node_obj("cp-01", taints=[CP_TAINT]), node_obj("gpu-01", 2)]
        assert scheduler.schedule(gpu_pod("p"), nodes, []) == ("gpu-01", "")

    def test_gpu_does_not_fit_real_text(self) -> None:
        nodes = [node_obj("cp-01", taints=[CP_TAINT]), node_obj("gpu-01", 2),
                 node_obj("gpu-02", 1), node_obj("cpu-01")]
        # 1.34+: DynamicResources' PostFilter speaks for every pod (the API server's
        # scheduler passes it, dra_server.schedule)
        node, msg = scheduler.schedule(gpu_pod("p", 4), nodes, [],
                                       postfilter="no new claims to deallocate")
        assert node is None
        assert msg == ("0/4 nodes are available: 1 node(s) had untolerated taint(s), 3 "
                       "Insufficient nvidia.com/gpu. no new claims to deallocate, preemption: 0/4"
                       " nodes are available: 1 Preemption is not helpful for scheduling, 3 No "
                       "preemption victims found for incoming pod.")

    def test_single_node_message_matches_reference(self) -> None:
        """The reference capture (before 1.34, no DynamicResources plugin); 1.34+ adds its
        PostFilter's "no new claims to deallocate, " before "preemption:"."""
        _, msg = scheduler.schedule(gpu_pod("p"), [node_obj("n", 0)], [])
        assert msg == ("0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 "
                       "nodes are available: 1 No preemption victims found for incoming pod.")

    def test_bound_pods_use_gpus(self) -> None:
        bound = gpu_pod("a", 2)
        bound["spec"]["nodeName"] = "gpu-01"
        bound["status"] = {"phase": "Running"}
        node, _ = scheduler.schedule(gpu_pod("b"), [node_obj("gpu-01", 2)], [bound])
        assert node is None
        bound["status"]["phase"] = "Succeeded"
        assert scheduler.schedule(gpu_pod("b"), [node_obj("gpu-01", 2)], [bound])[0] == "gpu-01"

    def test_tolerations_node_selector_cordon(self) -> None:
        nodes = [node_obj("cp-01", 1, taints=[CP_TAINT]),
                 node_obj("gpu-01", 1, labels={"gpu": "h100"}, unschedulable=True),
                 node_obj("gpu-02", 1, labels={"gpu": "h200"})]
        pod = gpu_pod("p", nodeSelector={"gpu": "h100"})
        node, msg = scheduler.schedule(pod, nodes, [])
        assert node is None
        assert msg.startswith("0/3 nodes are available: 1 node(s) didn't match Pod's node "
                              "affinity/selector, 1 node(s) had untolerated taint(s), 1 node(s) "
                              "were unschedulable.")
        pod["spec"]["tolerations"] = [{"key": "node-role.kubernetes.io/control-plane",
                                       "operator": "Exists", "effect": "NoSchedule"}]
        pod["spec"]["nodeSelector"] = {}
        assert scheduler.schedule(pod, nodes, [])[0] in ("cp-01", "gpu-02")

    def test_requests_cpu_memory(self) -> None:
        pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "resources": {
            "requests": {"cpu": "9", "memory": "1Gi"}}}]}}
        _, msg = scheduler.schedule(pod, [node_obj("a")], [])
        assert "1 Insufficient cpu" in msg

    def test_quantities_and_durations(self) -> None:
        assert parse_quantity("100m") * 10 == 1
        assert parse_quantity("57584828Ki") == 57584828 * 1024
        assert parse_duration("15m0s") == 900 and format_duration(900) == "15m0s"
        assert format_duration(86400) == "24h0m0s"
        with pytest.raises(ValueError):
            parse_duration("15 minutes")
