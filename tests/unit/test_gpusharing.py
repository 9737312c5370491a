"""gpu_sharing (issue 19, part 1: time-slicing): the inventory value, the device plugin's
per-node configs and labels, and the allocatable count gpuk8s waits for."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from gpuk8s.facts import HostFacts
from gpuk8s.facts.kube import Cluster, ClusterState, NodeStatus
from gpuk8s.gpusharing import CONFIG_LABEL, Sharing, check_gpu_sharing, config_map, sharing_of
from gpuk8s.roles import HostContext, load_role
from tests.unit.scenarios import default_vars


@pytest.mark.parametrize("value, message", [
    ({"mode": "time-slicing"}, "time-slicing needs replicas, a whole number from 2 to 64"),
    ({"mode": "time-slicing", "replicas": 1}, "got 1"),
    ({"mode": "time-slicing", "replicas": "4"}, "got '4'"),
    ({"mode": "time-slicing", "replicas": True}, "got True"),
    ({"mode": "time-slicing", "replicas": 65}, "got 65"),
    ({"mode": "timeslicing"}, "mode 'timeslicing' is not one of none, time-slicing"),
    ({"mode": "none", "replicas": 4}, "replicas 4 needs mode time-slicing"),
    ({"mode": "none", "slots": 4}, "unknown key(s) slots"),
    ({"mode": "none", "layout": "all-1g.10gb"}, "layout needs mode mig"),
    ({"mode": "mig"}, "mode mig needs a layout"),
    ({"mode": "mig", "layout": "all-2g.40gb"}, "layout 'all-2g.40gb' is not all-balanced"),
    ({"mode": "mig", "layout": "all-3g.40gb", "replicas": 2}, "replicas needs mode "
     "time-slicing"),
    ({"mode": "mig", "layout": [["3g.40gb"], []]}, "GPU 1): no MIG profile given"),
    ({"mode": "mig", "layout": [{"1g.10gb": 8}]}, "counts 1 to 7"),
    ({"mode": "mig", "layout": [["3g.41gb"]]}, "unknown MIG profile(s) 3g.41gb"),
    ({"mode": "mig", "layout": 7}, "layout must be all-balanced"),
])
def test_bad_values_are_refused_with_the_fix(value: dict[str, Any], message: str) -> None:
    problem = check_gpu_sharing("gpu_sharing", value)
    assert problem is not None and message in problem.message, problem
    assert "gpu_sharing:" in problem.fix


@pytest.mark.parametrize("value", [{}, {"mode": "none"}, {"mode": "time-slicing", "replicas": 4},
                                   {"mode": "time-slicing", "replicas": 64},
                                   {"mode": "mig", "layout": "all-3g.40gb"},
                                   {"mode": "mig", "layout": "all-balanced"},
                                   {"mode": "mig",
                                    "layout": [["3g.40gb", "3g.40gb"], {"1g.10gb": 7}]}])
def test_good_values(value: dict[str, Any]) -> None:
    assert check_gpu_sharing("gpu_sharing", value) is None


def test_config_map_has_one_config_per_setting_and_none_for_the_rest() -> None:
    cm = config_map([Sharing("time-slicing", 4), Sharing("time-slicing", 4), Sharing()])
    assert sorted(cm["data"]) == ["none", "time-slicing-4"]
    sliced = yaml.safe_load(cm["data"]["time-slicing-4"])
    assert sliced == {"version": "v1", "flags": {"migStrategy": "none"},
                      "sharing": {"timeSlicing": {"resources": [
                          {"name": "nvidia.com/gpu", "replicas": 4}]}}}
    assert yaml.safe_load(cm["data"]["none"]) == {"version": "v1",
                                                   "flags": {"migStrategy": "none"}}


def _plan(nodes: dict[str, Any], have: dict[str, NodeStatus],
          managed: dict[str, str] | None = None) -> list[Any]:
    vars = default_vars()
    cluster = {"nodes": nodes}
    facts = HostFacts("cp-01", {Cluster(): ClusterState(True, "", have, managed or {})})
    return load_role("gpu_cluster").plan(HostContext("cp-01", "gpu_cluster", vars, facts,
                                                     cluster, ("control_plane",)))


def _node(name: str, gpus: int, ready: bool = True, gpu: int | None = None,
          labels: dict[str, str] | None = None) -> NodeStatus:
    return NodeStatus(name, ready, False, "v1.36.2", "containerd://2.1.4", gpu, labels or {},
                      nvidia={} if gpu is None else {"nvidia.com/gpu": gpu})


NODES = {"gpu-01": {"name": "gpu-01", "gpus": 2, "model": "NVIDIA H100 80GB HBM3",
                    "schedulable": True, "sharing": {}},
         "gpu-02": {"name": "gpu-02", "gpus": 1, "model": "NVIDIA H200", "schedulable": True,
                    "sharing": {"mode": "time-slicing", "replicas": 4}}}


def test_time_slicing_on_one_node_labels_it_and_waits_for_four_slots() -> None:
    ops = _plan(NODES, {"gpu-01": _node("gpu-01", 2, gpu=2),
                        "gpu-02": _node("gpu-02", 1, gpu=1)})
    by_id = {op.id: op for op in ops}
    manifest = "\n".join(by_id["gpu_cluster | device plugin"].commands)
    assert "time-slicing-4" in manifest and "config-manager" in manifest
    sharing = by_id["gpu_cluster | sharing gpu-02"]
    assert sharing.reason == ("+ label gpu-02: nvidia.com/device-plugin.config=time-slicing-4 "
                              "nvidia.com/gpu.replicas=4")
    wait = by_id["gpu_cluster | gpu-02 allocatable nvidia.com/gpu"]
    assert wait.reason == "+ wait until gpu-02 offers 4 nvidia.com/gpu (1 GPU(s) x 4) (now 1)"
    assert "=4 node/gpu-02" in wait.commands[0]
    # gpu-01 keeps the default config; its wait comes before gpu-02's label (one at a time)
    ids = [op.id for op in ops]
    assert ids.index("gpu_cluster | gpu-01 allocatable nvidia.com/gpu") < \
        ids.index("gpu_cluster | sharing gpu-02")
    assert "device-plugin.config=none" in by_id["gpu_cluster | sharing gpu-01"].reason


def _applied(ops: list[Any]) -> dict[str, str]:
    """The Cluster fact's view of gpuk8s's objects once the plan's manifests were applied."""
    import yaml

    managed: dict[str, str] = {}
    for op in ops:
        if op.changes and "apply --server-side" in op.commands[0]:
            body = op.commands[0].split("\n", 1)[1].rsplit("\n", 2)[0]
            for d in yaml.safe_load_all(body):
                if d:
                    md = d["metadata"]
                    managed[f"{d['kind']}/{md.get('namespace', '')}/{md['name']}"] = \
                        md["annotations"]["gpuk8s.io/sha256"]
    return managed


def test_a_converged_node_is_a_no_op() -> None:
    labels = {CONFIG_LABEL: "time-slicing-4", "nvidia.com/gpu.replicas": "4",
              "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "1",
              "nvidia.com/gpu.product": "NVIDIA-H200"}
    have = {"gpu-02": _node("gpu-02", 1, gpu=4, labels=labels)}
    first = _plan({"gpu-02": NODES["gpu-02"]}, have)
    # while the device plugin's DaemonSet changes, its pods restart: every node is waited for
    wait = next(op for op in first if op.id == "gpu_cluster | gpu-02 allocatable nvidia.com/gpu")
    assert wait.changes and wait.reason.endswith("again, as the changed device plugin restarts")
    ops = _plan({"gpu-02": NODES["gpu-02"]}, have, managed=_applied(first))
    by_id = {op.id: op for op in ops}
    assert not by_id["gpu_cluster | sharing gpu-02"].changes
    wait = by_id["gpu_cluster | gpu-02 allocatable nvidia.com/gpu"]
    assert not wait.changes and wait.reason == ("= gpu-02: 4 nvidia.com/gpu allocatable "
                                                "(1 GPU(s) x 4)")


def test_sharing_of_reads_the_checked_value() -> None:
    assert sharing_of(None) == Sharing() and sharing_of({"mode": "none"}) == Sharing()
    assert sharing_of({"mode": "time-slicing", "replicas": 3}).offered(2) == 6
    assert json.loads(json.dumps(config_map([])))["metadata"]["name"] == \
        "nvidia-device-plugin-configs"
