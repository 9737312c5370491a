"""The lab's users and groups (gpuk8s.tenancy, roles/tenancy, invoke user-kubeconfig): the
inventory's checks, the objects each namespace gets, removed users kept unless pruned, and
the kubeconfig command's refusals before it contacts any host."""

from __future__ import annotations

import io
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s import tenancy
from gpuk8s.api import check
from gpuk8s.day2.users import hours, user_kubeconfig
from gpuk8s.errors import Gpuk8sError, InventoryError
from gpuk8s.facts import HostFacts
from gpuk8s.facts.kube import Cluster, ClusterState, NodeStatus
from gpuk8s.report import Reporter
from gpuk8s.roles import HostContext, load_role
from gpuk8s.variables import check_combination
from tests.unit.scenarios import default_vars

NODES = {"cp-01": {"name": "cp-01", "address": "10.0.0.10", "gpus": 0, "model": "",
                   "sharing": {}, "schedulable": False},
         "gpu-01": {"name": "gpu-01", "address": "10.0.0.21", "gpus": 2,
                    "model": "NVIDIA H100 80GB HBM3", "sharing": {"mode": "none"}},
         "gpu-02": {"name": "gpu-02", "address": "10.0.0.22", "gpus": 1,
                    "model": "NVIDIA A100-SXM4-40GB",
                    "sharing": {"mode": "mig", "layout": "all-3g.20gb"}}}
USERS = {"alice": {"gpu_quota": 2, "groups": ["vision"], "cpu": "16", "memory": "64Gi",
                   "admin": True},
         "bob": {"gpu_quota": 1}}
GROUPS = {"vision": {"gpu_quota": 4, "pods": 20}}


def _docs(command: str) -> dict[str, Any]:
    """The objects an apply op sends (its heredoc's body), by kind."""
    body = command.split("\n", 1)[1].rsplit("GPUK8S_EOF_", 1)[0]
    return {d["kind"]: d for d in yaml.safe_load_all(body) if d}


def _plan(managed: dict[str, str] | None = None, **vars: Any) -> list[Any]:
    facts = HostFacts("cp-01", {Cluster(): ClusterState(True, "", {}, managed or {})})
    ctx = HostContext("cp-01", "tenancy", default_vars(**vars), facts, {"nodes": NODES},
                      ("control_plane",))
    return load_role("tenancy").plan(ctx)


def _problem(name: str, value: Any) -> str:
    rule = load_role("tenancy").rules()[name]
    assert rule.check is not None
    problem = rule.check(name, value)
    assert problem is not None, value
    return f"{problem.message} | {problem.fix}"


@pytest.mark.parametrize("value, message", [
    ({"Alice": {}}, "is not a DNS-1123 label"),
    ({"kube-system": {}}, "would take a namespace of Kubernetes"),
    ({"default": {}}, "would take a namespace"),
    ({"gpuk8s-monitoring": {}}, "would take a namespace"),
    ({"jupyterhub": {}}, "would take a namespace"),
    ({"alice": {"gpu_quta": 1}}, "unknown key 'gpu_quta' (did you mean gpu_quota?)"),
    ({"alice": {"gpu_quota": -1}}, "gpu_quota must be a whole number of GPUs, 0 or more"),
    ({"alice": {"gpu_quota": 1.5}}, "gpu_quota must be a whole number"),
    ({"alice": {"gpu_quota": True}}, "gpu_quota must be a whole number"),
    ({"alice": {"memory": "64 GB"}}, "memory must be a Kubernetes quantity"),
    ({"alice": {"cpu": "$(reboot)"}}, "cpu must be a Kubernetes quantity"),
    ({"alice": {"pods": 0}}, "pods must be a whole number, 1 or more"),
    ({"alice": {"groups": "vision"}}, "groups must be a list"),
    ({"alice": {"admin": "yes"}}, "admin must be true or false"),
    ({"alice": [1]}, "expected a mapping"),
])
def test_bad_users_are_refused_with_what_to_write(value: dict[str, Any], message: str) -> None:
    text = _problem("lab_users", value)
    assert message in text and "write lab_users:" in text


def test_bad_groups_and_defaults_are_refused() -> None:
    assert "unknown key 'admin'" in _problem("lab_groups", {"vision": {"admin": True}})
    assert "must be a Kubernetes quantity" in _problem("tenancy_default_cpu_request", "1 core")
    rule = load_role("tenancy").rules()["tenancy_default_memory_limit"]
    assert rule.check is not None and rule.check("tenancy_default_memory_limit", "") is None


def test_users_against_groups() -> None:
    (problem,) = [p for p in check_combination(default_vars(
        lab_users={"alice": {"groups": ["visoin"]}}, lab_groups={"vision": {}}))
        if p.key == "lab_users"]
    assert "group 'visoin' is not in lab_groups (did you mean vision?)" in problem.message
    (problem,) = [p for p in check_combination(default_vars(
        lab_users={"ml": {}} | {"team": {}}, lab_groups={"team": {}})) if p.key == "lab_users"]
    assert "both name 'team'" in problem.message
    assert not [p for p in check_combination(default_vars(lab_users=USERS, lab_groups=GROUPS))
                if p.key == "lab_users"]


def test_check_shows_the_users_and_refuses_a_bad_one(tmp_path: Path) -> None:
    inv = tmp_path / "inventory.yaml"
    inv.write_text(textwrap.dedent("""\
        all:
          vars: {lab_users: {alice: {gpu_quota: 2}, bob: {gpu_quota: 1}}}
          children:
            control_plane: {hosts: {cp-01: {ansible_host: 10.0.0.10}}}
        """))
    out = io.StringIO()
    result = check(inv, reporter=Reporter(out))
    changed = {c["name"]: c["value"] for c in result["changed"]}
    assert json.loads(changed["lab_users"]) == {"alice": {"gpu_quota": 2},
                                                "bob": {"gpu_quota": 1}}
    assert "lab_users" in out.getvalue()
    inv.write_text(inv.read_text().replace("gpu_quota: 1}", "gpu_qouta: 1}"))
    out = io.StringIO()
    with pytest.raises(InventoryError, match="1 problem"):
        check(inv, reporter=Reporter(out))
    assert "lab_users: bob: unknown key 'gpu_qouta' (did you mean gpu_quota?)" in out.getvalue()


def test_each_user_and_group_gets_its_namespace_quota_defaults_and_edit_there() -> None:
    ops = _plan(lab_users=USERS, lab_groups=GROUPS)
    assert [op.id for op in ops] == ["tenancy | user alice", "tenancy | user bob",
                                     "tenancy | group vision"]
    assert all(op.changes and op.reason.startswith("+ create tenancy-") for op in ops)
    alice = _docs(ops[0].commands[0])
    assert alice["Namespace"]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == \
        "baseline"
    # every GPU resource the nodes offer: whole GPUs and gpu-02's MIG profile
    assert alice["ResourceQuota"]["spec"]["hard"] == {
        "requests.nvidia.com/gpu": "2", "requests.nvidia.com/mig-3g.20gb": "2",
        "requests.cpu": "16", "requests.memory": "64Gi"}
    assert alice["LimitRange"]["spec"]["limits"] == [{
        "type": "Container", "defaultRequest": {"cpu": "100m", "memory": "256Mi"},
        "default": {"memory": "8Gi"}}]
    binding = alice["RoleBinding"]
    assert binding["metadata"]["namespace"] == "alice"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": "edit"}
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                    "name": "alice"}]
    vision = _docs(ops[2].commands[0])
    assert [s["name"] for s in vision["RoleBinding"]["subjects"]] == ["alice"]
    assert vision["ResourceQuota"]["spec"]["hard"]["pods"] == "20"


def test_a_gpu_resource_a_node_offers_is_in_the_quota() -> None:
    facts = HostFacts("cp-01", {Cluster(): ClusterState(True, "", {"gpu-01": NodeStatus(
        "gpu-01", True, False, "", "", 2, {}, (), "", {"nvidia.com/gpu.shared": 4})}, {})})
    ctx = HostContext("cp-01", "tenancy", default_vars(lab_users={"bob": {"gpu_quota": 1}}),
                      facts, {"nodes": NODES}, ("control_plane",))
    (op,) = load_role("tenancy").plan(ctx)
    hard = _docs(op.commands[0])["ResourceQuota"]["spec"]["hard"]
    assert hard["requests.nvidia.com/gpu.shared"] == "1"


def test_second_run_changes_nothing_and_no_users_is_one_noop() -> None:
    first = _plan(lab_users=USERS, lab_groups=GROUPS)
    managed = {k: v for op in first for k, v in
               zip(op.meta["objects"].split(","),
                   [op.commands[0].split("gpuk8s.io/sha256: ")[1].split()[0].strip("'\"")] * 4,
                   strict=True)}
    again = _plan(managed, lab_users=USERS, lab_groups=GROUPS)
    assert [op.changes for op in again] == [False, False, False]
    (op,) = _plan()
    assert not op.changes and op.reason == "= no lab_users or lab_groups"


def test_a_removed_user_is_kept_and_reported_then_deleted_only_with_prune() -> None:
    managed = {"Namespace//carol": "x", "ResourceQuota/carol/gpuk8s-quota": "x",
               "ResourceQuota/ml/other-quota": "x"}
    ops = _plan(managed, lab_users={"bob": {"gpu_quota": 1}})
    kept = ops[-1]
    assert kept.id == "tenancy | removed carol" and not kept.changes and kept.warning
    assert "carol is no longer in lab_users or lab_groups (bootstrap --prune" in kept.reason
    ops = _plan(managed, lab_users={"bob": {"gpu_quota": 1}}, tenancy_prune=True)
    assert ops[-1].changes and "delete namespace/carol" in ops[-1].commands[0]
    assert all("ml" not in op.id for op in ops)


def test_prune_flag_sets_the_variable() -> None:
    from gpuk8s.cli import _pruned

    assert _pruned(["a=b"], True) == ["a=b", "tenancy_prune=true"]
    assert _pruned(None, False) == []


def test_manifest_values_are_data() -> None:
    t = tenancy.Tenant("alice", "user", 1, ("alice",), cpu="2", memory="1Gi")
    text = tenancy.manifest(t, ["nvidia.com/gpu"], {"cpu_request": "100m",
                                                    "memory_request": "256Mi",
                                                    "memory_limit": ""}, "restricted")
    docs = [json.loads(d) for d in text.split("---\n") if d.strip()]
    assert [d["kind"] for d in docs] == ["Namespace", "ResourceQuota", "LimitRange",
                                         "RoleBinding"]
    assert "default" not in docs[2]["spec"]["limits"][0]


def test_durations() -> None:
    assert hours("24h") == 24 and hours("1h30m") == 1.5 and hours("2160h") == 2160


def test_user_kubeconfig_refuses_before_contacting_a_host(tmp_path: Path) -> None:
    inv = tmp_path / "inventory.yaml"
    inv.write_text(textwrap.dedent("""\
        all:
          vars: {lab_users: {alice: {gpu_quota: 2}}}
          children:
            control_plane: {hosts: {cp-01: {ansible_host: 10.0.0.10}}}
        """))

    def opener(*_: Any, **__: Any) -> Any:
        raise AssertionError("no host may be contacted")

    with pytest.raises(Gpuk8sError, match=r"'alcie' is not in lab_users .*did you mean alice"):
        user_kubeconfig(inv, "alcie", opener=opener)
    with pytest.raises(Gpuk8sError, match="--validity '1 day' is not a duration"):
        user_kubeconfig(inv, "alice", validity="1 day", opener=opener)


def test_with_dra_the_quota_counts_each_device_class() -> None:
    (op,) = _plan(lab_users={"bob": {"gpu_quota": 1}}, gpu_allocation="dra")
    hard = _docs(op.commands[0])["ResourceQuota"]["spec"]["hard"]
    assert hard["gpu.nvidia.com.deviceclass.resource.k8s.io/devices"] == "1"
    assert hard["mig.nvidia.com.deviceclass.resource.k8s.io/devices"] == "1"
