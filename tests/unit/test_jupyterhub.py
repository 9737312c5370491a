"""JupyterHub's rendering (issue 35): profiles from the nodes' offer, the objects it may make
outside its namespace, the certificate's names, undeploy's keep-or-purge. The hub running for
real (JupyterHub 5.5.0, KubeSpawner 7.0.0, CHP 5.2.0) is tests/lab/product/test_jupyterhub.py."""

from __future__ import annotations

import ast
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s.workloads import hub
from gpuk8s.workloads.commands import render_manifests
from gpuk8s.workloads.values import WorkloadError, load_values

ROOT = Path(__file__).resolve().parents[2]


def node(alloc: dict[str, str], unschedulable: bool = False) -> dict[str, Any]:
    return {"spec": {"unschedulable": unschedulable}, "status": {"allocatable": alloc}}


def test_gpu_offer_takes_the_most_one_schedulable_node_has() -> None:
    nodes = {"items": [node({"cpu": "8", "nvidia.com/gpu": "2"}),
                       node({"nvidia.com/gpu": "8"}, unschedulable=True),
                       node({"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "7",
                             "nvidia.com/gpu.shared": "4", "nvidia.com/mig-3g.40gb": "0"})]}
    assert hub.gpu_offer(nodes) == {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 7,
                                    "nvidia.com/gpu.shared": 4}


def test_profiles_follow_the_offer() -> None:
    values = load_values("jupyterhub", sets=["gpuIdleTimeout=120", "maxGpus=4"])
    offer = {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 7, "nvidia.com/gpu.shared": 4}
    got = hub.profiles(values, offer)
    assert [p["slug"] for p in got] == ["cpu", "gpu-1", "gpu-2", "mig-1g-10gb", "gpu-shared"]
    assert got[0]["default"] is True and "kubespawner_override" not in got[0]
    two = got[2]["kubespawner_override"]
    assert two["extra_resource_limits"] == {"nvidia.com/gpu": "2"}
    assert two["extra_pod_config"] == {"runtimeClassName": "nvidia"}
    assert "--ServerApp.shutdown_no_activity_timeout=120" in two["args"]
    assert two["environment"] == {}   # the CPU servers' NVIDIA_VISIBLE_DEVICES=void is not kept
    assert got[3]["kubespawner_override"]["extra_resource_limits"] == {
        "nvidia.com/mig-1g.10gb": "1"}
    # no GPUs at all: CPU only; gpuIdleTimeout 0: no self-shutdown
    assert [p["slug"] for p in hub.profiles(values, {})] == ["cpu"]
    none = load_values("jupyterhub", sets=["gpuIdleTimeout=0"])
    assert hub.profiles(none, {"nvidia.com/gpu": 1})[1]["kubespawner_override"]["args"] == []


def test_render_names_only_the_inventory_users(tmp_path: Path) -> None:
    inv = yaml.safe_load((ROOT / "inventories/lab.yaml").read_text())
    inv["all"]["vars"]["lab_users"] = {"alice": {"gpu_quota": 2, "admin": True},
                                       "bob": {"gpu_quota": 1}}
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(inv))
    docs = [d for d in yaml.safe_load_all(render_manifests(path, "jupyterhub")) if d]
    kinds = sorted((d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])
                   for d in docs)
    assert ("RoleBinding", "alice", hub.BINDING) in kinds
    assert ("RoleBinding", "bob", hub.BINDING) in kinds
    assert ("PersistentVolume", "", "jupyterhub-home-alice") in kinds
    assert ("ClusterRole", "", hub.SPAWNER_ROLE) in kinds
    # the hub can run pods in the users' namespaces and nowhere else: no ClusterRoleBinding
    assert not [k for k in kinds if k[0] == "ClusterRoleBinding"]
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    settings = json.loads(cm["data"]["gpuk8s.json"])
    assert settings["users"] == ["alice", "bob"] and settings["admins"] == ["alice"]
    # the configuration is fixed Python: no inventory value is ever written into it
    assert cm["data"]["jupyterhub_config.py"] == hub.config_py()
    assert "alice" not in hub.config_py()
    ast.parse(hub.config_py())
    home = next(d for d in docs if d["metadata"]["name"] == "jupyterhub-home-bob")
    assert home["spec"]["claimRef"] == {"namespace": "bob", "name": "claim-bob"}
    assert home["spec"]["nfs"]["path"] == "/srv/gpuk8s/homes/bob"
    assert all(d["metadata"]["labels"]["gpuk8s.io/workload"] == "jupyterhub" for d in docs
               if d["kind"] != "Namespace")


def test_outside_objects_are_checked() -> None:
    values = load_values("jupyterhub")
    docs = hub.outside_objects(values, ["alice"], "10.0.0.1")
    hub.check_outside(docs, "jupyterhub", ["alice"])
    stray = copy.deepcopy(docs[1])
    stray["metadata"]["namespace"] = "kube-system"
    with pytest.raises(WorkloadError, match=r"RoleBinding/gpuk8s-jupyterhub .*kube-system"):
        hub.check_outside([stray], "jupyterhub", ["alice"])
    pv = copy.deepcopy(docs[-1])
    pv["spec"]["claimRef"]["namespace"] = "mallory"
    with pytest.raises(WorkloadError, match="its claim is in namespace 'mallory'"):
        hub.check_outside([pv], "jupyterhub", ["alice"])


def test_certificate_names() -> None:
    values = load_values("jupyterhub")
    values["https"]["hosts"] = ["Hub.Lab.Example", "10.0.0.9"]
    sans = hub.subject_alt_names(values, ["10.88.0.2", "gpu01.lab", "10.88.0.2"])
    assert sans == ["DNS:proxy-public", "DNS:proxy-public.jupyterhub.svc",
                    "DNS:proxy-public.jupyterhub.svc.cluster.local", "IP:10.88.0.2",
                    "DNS:gpu01.lab", "DNS:hub.lab.example", "IP:10.0.0.9"]
    values["https"]["hosts"] = ["evil,DNS:*"]
    with pytest.raises(WorkloadError, match="neither an IP address nor a host name"):
        hub.subject_alt_names(values, [])


def test_undeploy_keeps_homes_unless_purge() -> None:
    keep = hub.undeploy_script("jupyterhub", purge=False, wait_s=60)
    purge = hub.undeploy_script("jupyterhub", purge=True, wait_s=60)
    assert "persistentvolumeclaims" not in keep and "persistentvolumes" not in keep
    assert "delete persistentvolumes -l gpuk8s.io/workload=jupyterhub" in purge
    assert "delete pods -A -l gpuk8s.io/workload=jupyterhub" in keep


def test_values_are_checked() -> None:
    with pytest.raises(WorkloadError, match=r"homes\.nfs\.path"):
        load_values("jupyterhub", sets=["homes.nfs.path=/srv/x;reboot"])
    with pytest.raises(WorkloadError, match=r"homes\.accessMode"):
        load_values("jupyterhub", sets=["homes.accessMode=ReadOnlyMany"])


def test_folders_script_quotes_and_keeps_existing() -> None:
    script = hub.folders_script("/srv/gpuk8s/", ["alice"])
    assert "install -d -o 1000 -g 100 -m 0700 /srv/gpuk8s/homes/alice" in script
    assert "[ -d /srv/gpuk8s/homes/alice ] ||" in script


def test_memory_reaches_jupyterhub_in_bytes() -> None:
    # JupyterHub's ByteSpecification refuses Kubernetes' binary suffixes ("1Gi")
    values = load_values("jupyterhub", sets=["memory=1Gi"])
    assert hub.settings(values, [], [], {})["memory"] == 2**30
    with pytest.raises(WorkloadError, match="not a memory quantity"):
        hub.settings(load_values("jupyterhub", sets=["memory=lots"]), [], [], {})
