"""What gpuk8s writes and plans, held against what the upstream programs do at the tags gpuk8s
pins. Each table row below is a fact read in upstream's source at that tag (cited beside it),
written down by us; a manifest or role that drifts from one fails here in seconds, not in a
cluster. An audit that read each project at its pinned tag found the defects these rows keep
fixed."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from gpuk8s.checks import check_driver_branch
from gpuk8s.facts import HostFacts
from gpuk8s.facts.system import FileState, PciDevice
from gpuk8s.roles import HostContext, load_role
from tests.unit.scenarios import default_vars, fresh_facts

ROOT = Path(__file__).resolve().parents[2]
CTK = ROOT / "tests" / "fixtures" / "nvidia-ctk-1.20.0"


def _ctx(role: str, os_key: str, gpus: int, vars: dict[str, Any],
         **facts: Any) -> HostContext:
    values = dict(fresh_facts(os_key, gpus, "gpu", vars).items())
    for fact, value in facts.items():
        for key in values:
            if type(key).__name__ == fact:
                values[key] = value(key, values[key])
    return HostContext("gpu", role, vars, HostFacts("gpu", values), {}, ("workers",))


# ------------------------------------------------------------------ nvidia-ctk and config.toml
def _with_config(content: bytes) -> Any:
    def put(key: Any, value: dict[str, FileState]) -> dict[str, FileState]:
        path = "/etc/containerd/config.toml"
        if path not in value:
            return value
        return {**value, path: FileState(path, True, "644", "root",
                                         hashlib.sha256(content).hexdigest(), content)}
    return put


def _config_op(content: bytes) -> Any:
    ctx = _ctx("container_runtime", "debian12", 1, default_vars(), Files=_with_config(content))
    return next(op for op in load_role("container_runtime").plan(ctx)
                if op.id == "container_runtime | config.toml")


def test_config_toml_as_the_real_nvidia_ctk_rewrote_it_is_up_to_date() -> None:
    """nvidia-ctk v1.20.0 re-marshals config.toml every time it writes its drop-in
    (pkg/config/engine/containerd/config_drop_in.go@v1.20.0 Save -> topLevelConfig.Save);
    the bytes it wrote (tests/fixtures/nvidia-ctk-1.20.0) must not plan a rewrite and a
    containerd restart on the second run."""
    template = (CTK / "config.template.toml").read_bytes()
    assert not _config_op(template).changes  # the fixture is what gpuk8s renders today
    op = _config_op((CTK / "config.after-ctk.toml").read_bytes())
    assert not op.changes, op.reason
    assert "same settings" in op.reason


def test_config_toml_with_other_settings_is_still_rewritten() -> None:
    changed = (CTK / "config.after-ctk.toml").read_bytes().replace(
        b"SystemdCgroup = true", b"SystemdCgroup = false")
    op = _config_op(changed)
    assert op.changes and "restart containerd" in op.notify
    assert op.diff and "SystemdCgroup = true" in op.diff
    assert _config_op(b"not = [toml").changes


# ------------------------------------------------------------------ driver packages
def _gpu(device: str) -> PciDevice:
    return PciDevice("0000:18:00.0", "0x10de", device, "0x030200")


@pytest.mark.parametrize("device, name, flavour", [
    # pci.ids names; the open modules' table starts at TU102 0x1e02
    # (NVIDIA/open-gpu-kernel-modules README.md "Compatible GPUs")
    ("0x1df6", "Tesla V100S PCIe 32GB", "proprietary"),
    ("0x15f9", "Tesla P100 SXM2 16GB", "proprietary"),
    ("0x1db8", "Tesla V100 SXM3 32GB", "proprietary"),
    ("0x1bb3", "Tesla P4", "proprietary"),
    ("0x1b38", "Tesla P40", "proprietary"),
    ("0x1db4", "Tesla V100 PCIe 16GB", "proprietary"),
    ("0x1eb8", "Tesla T4", "open"),
    ("0x20b0", "A100 SXM4 40GB", "open"),
    ("0x2330", "H100 SXM5 80GB", "open"),
])
def test_gpus_older_than_turing_get_the_proprietary_module(device: str, name: str,
                                                           flavour: str) -> None:
    from roles.nvidia_driver.role import flavour as pick

    assert pick({"nvidia_driver_flavor": "auto"}, [_gpu(device)]) == flavour, name


@pytest.mark.parametrize("os_key, source, branch, package", [
    # Ubuntu's archive: nvidia-fabricmanager-<branch> (multiverse, source fabric-manager-580)
    ("ubuntu2404", "auto", "580", "nvidia-fabricmanager-580"),
    ("ubuntu2204", "ubuntu", "570", "nvidia-fabricmanager-570"),
    # NVIDIA's CUDA repository: unversioned from 580, -<branch> before
    # (NVIDIA/cloud-native-stack playbooks/nvidia-driver.yaml)
    ("debian12", "auto", "580", "nvidia-fabricmanager"),
    ("ubuntu2404", "cuda", "580", "nvidia-fabricmanager"),
    ("ubuntu2404", "cuda", "570", "nvidia-fabricmanager-570"),
    ("debian12", "cuda", "535", "nvidia-fabricmanager-535"),
])
def test_fabric_manager_package_by_source_and_branch(os_key: str, source: str, branch: str,
                                                     package: str) -> None:
    v = default_vars(nvidia_driver_source=source, nvidia_driver_branch=branch,
                     nvidia_fabricmanager=True)
    ops = load_role("nvidia_driver").plan(_ctx("nvidia_driver", os_key, 8, v))
    fm = next(op for op in ops if op.id == "nvidia_driver | fabric manager")
    assert package in fm.reason
    names = {w.split("=")[0] for w in fm.reason.replace(",", " ").split()
             if w.startswith("nvidia-fabric")}
    assert names == {package}, fm.reason


@pytest.mark.parametrize("branch", ["590", "595"])
def test_branches_from_590_are_refused_with_the_reason(branch: str) -> None:
    problem = check_driver_branch("nvidia_driver_branch", branch)
    assert problem is not None
    assert f"nvidia-driver-pinning-{branch}" in problem.message
    assert '"580"' in problem.fix


# ------------------------------------------------------------------ manifests against upstream
def _docs(role: str, template: str, **vars: Any) -> list[dict[str, Any]]:
    import yaml

    from gpuk8s.roles import render

    return [d for d in yaml.safe_load_all(render(role, template, default_vars(**vars))) if d]


def _kind(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def _grants(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(group in r.get("apiGroups", []) and
               (resource in r.get("resources", []) or "*" in r.get("resources", [])) and
               (verb in r.get("verbs", []) or "*" in r.get("verbs", []))
               for r in rules if not r.get("resourceNames"))


#: (group, resources, verbs) upstream grants, manifests/calico.yaml@v3.32.1 lines 6923-7353
#: (ClusterRoles calico-node, calico-cni-plugin, calico-kube-controllers); CRD means both
#: crd.projectcalico.org and projectcalico.org
CALICO_RBAC: dict[str, list[tuple[str, str, str]]] = {
    "calico-node": [
        ("", "pods nodes namespaces", "get"),
        ("discovery.k8s.io", "endpointslices", "watch list"),
        ("", "endpoints services", "watch list get"),
        ("", "configmaps", "get"),
        ("", "nodes/status", "patch update"),
        ("networking.k8s.io", "networkpolicies", "watch list"),
        ("policy.networking.k8s.io", "clusternetworkpolicies", "watch list"),  # M:7177
        ("", "pods namespaces serviceaccounts", "list watch"),
        ("", "pods/status", "patch"),
        ("CRD", "globalfelixconfigs globalbgpconfigs felixconfigurations bgppeers bgpfilters "
                "bgpconfigurations ippools ipreservations ipamblocks globalnetworkpolicies "
                "stagedglobalnetworkpolicies networkpolicies stagednetworkpolicies "
                "stagedkubernetesnetworkpolicies globalnetworksets networksets "
                "clusterinformations hostendpoints blockaffinities caliconodestatuses tiers",
         "get list watch"),
        ("CRD", "tiers", "create"),  # M:7227
        ("CRD", "ippools felixconfigurations bgpconfigurations clusterinformations",
         "create update"),
        ("CRD", "caliconodestatuses", "update"),
        ("", "nodes", "get list watch"),
        ("CRD", "bgpconfigurations bgppeers", "create update"),  # M:7257
        ("CRD", "blockaffinities ipamblocks ipamhandles", "get list create update delete"),
        ("CRD", "ipamconfigurations ipamconfigs", "get create"),
        ("CRD", "blockaffinities", "watch"),
        ("apps", "daemonsets", "get"),
        ("kubevirt.io", "virtualmachineinstancemigrations", "get list watch"),  # M:7300
    ],
    "calico-cni-plugin": [
        ("", "pods nodes namespaces", "get"),
        ("", "pods/status", "patch"),
        ("CRD", "blockaffinities ipamblocks ipamhandles clusterinformations ippools "
                "ipreservations ipamconfigurations ipamconfigs", "get list create update delete"),
        ("kubevirt.io", "virtualmachineinstances virtualmachines", "get"),
    ],
    "calico-kube-controllers": [
        ("", "nodes", "watch list get"),
        ("", "pods namespaces", "get list watch"),
        ("", "services services/status", "get list update watch"),
        ("CRD", "ipreservations", "list"),
        ("CRD", "blockaffinities ipamblocks ipamhandles ipamconfigurations ipamconfigs tiers",
         "get list create update delete watch"),
        ("CRD", "ippools", "list watch"),
        ("CRD", "hostendpoints", "get list create update delete watch"),
        ("CRD", "clusterinformations", "get list create update watch"),
        ("CRD", "kubecontrollersconfigurations", "get list create update watch"),
        ("CRD", "kubecontrollersconfigurations/status", "get update"),  # M:7024
        ("CRD", "networkpolicies stagednetworkpolicies globalnetworkpolicies "
                "stagedglobalnetworkpolicies", "watch list get create update delete"),
        ("apps", "daemonsets deployments", "get list watch"),
        ("kubevirt.io", "virtualmachines virtualmachineinstances", "get list watch"),
    ],
}


@pytest.mark.parametrize("role", sorted(CALICO_RBAC))
def test_calico_cluster_roles_grant_what_upstream_grants(role: str) -> None:
    rules = _kind(_docs("cni", "cni/calico.yaml.j2", cni="calico"), "ClusterRole",
                  role)["rules"]
    missing = [f"{verb} {resource} ({group or 'core'})"
               for group_name, resources, verbs in CALICO_RBAC[role]
               for group in (("crd.projectcalico.org", "projectcalico.org")
                             if group_name == "CRD" else (group_name,))
               for resource in resources.split() for verb in verbs.split()
               if not _grants(rules, group, resource, verb)]
    assert not missing, f"{role} lacks what upstream grants: {missing}"


def test_calico_node_may_give_the_cni_plugin_its_token() -> None:
    rules = _kind(_docs("cni", "cni/calico.yaml.j2", cni="calico"), "ClusterRole",
                  "calico-node")["rules"]
    assert {"apiGroups": [""], "resources": ["serviceaccounts/token"],
            "resourceNames": ["calico-cni-plugin"], "verbs": ["create"]} in rules


def test_calico_crds_and_status_subresources_as_upstream() -> None:
    """manifests/calico.yaml@v3.32.1 ships 22 crd.projectcalico.org CRDs (v1) and
    clusternetworkpolicies.policy.networking.k8s.io (v1alpha2, network-policy-api v0.2.0);
    status subresources on kubecontrollersconfigurations (M:3911) and clusternetworkpolicies
    (M:6911) only."""
    crds = {d["metadata"]["name"]: d for d in _docs("cni", "cni/calico.yaml.j2", cni="calico")
            if d["kind"] == "CustomResourceDefinition"}
    calico = {n for n in crds if n.endswith(".crd.projectcalico.org")}
    assert len(calico) == 22
    cnp = crds["clusternetworkpolicies.policy.networking.k8s.io"]["spec"]
    assert (cnp["scope"], cnp["names"]["kind"], [v["name"] for v in cnp["versions"]]) == \
        ("Cluster", "ClusterNetworkPolicy", ["v1alpha2"])
    with_status = {n for n, d in crds.items() for v in d["spec"]["versions"]
                   if "status" in (v.get("subresources") or {})}
    assert with_status == {"kubecontrollersconfigurations.crd.projectcalico.org",
                           "clusternetworkpolicies.policy.networking.k8s.io"}


def test_calico_node_mounts_the_cni_config_folder_for_the_plugin_token() -> None:
    ds = _kind(_docs("cni", "cni/calico.yaml.j2", cni="calico"), "DaemonSet", "calico-node")
    node = next(c for c in ds["spec"]["template"]["spec"]["containers"]
                if c["name"] == "calico-node")
    assert {"name": "cni-net-dir", "mountPath": "/host/etc/cni/net.d"} in node["volumeMounts"]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


def test_dra_kubelet_plugin_has_the_flags_upstream_requires() -> None:
    """cmd/gpu-kubelet-plugin/main.go@v0.4.0 marks --node-name (NODE_NAME) and --image-name
    (IMAGE_NAME) Required (urfave/cli v2.27.7: 'Required flag "image-name" not set', exit 1);
    the chart sets IMAGE_NAME to the plugin's own image (templates/kubeletplugin.yaml@v0.4.0)."""
    docs = _docs("gpu_cluster", "gpu/nvidia-dra-driver.yaml.j2", gpu_allocation="dra")
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    gpus = next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "gpus")
    env = _env(gpus)
    assert env["IMAGE_NAME"] == gpus["image"]
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert gpus["securityContext"] == {"privileged": True}  # values.yaml@v0.4.0 default


def test_dra_kubelet_plugin_may_not_update_nodes() -> None:
    """The GPU plugin gets its own Node only (ResourceSlice owner); the chart's node update is
    for the ComputeDomain binaries gpuk8s does not deploy (security review 2, M1)."""
    docs = _docs("gpu_cluster", "gpu/nvidia-dra-driver.yaml.j2", gpu_allocation="dra")
    rules = next(d for d in docs if d["kind"] == "ClusterRole")["rules"]
    assert not _grants(rules, "", "nodes", "update")
    assert not _grants(rules, "", "nodes", "patch")
    for verb in ("get", "list", "watch"):
        assert _grants(rules, "", "nodes", verb)
    for verb in ("list", "watch", "create", "update", "delete"):
        assert _grants(rules, "resource.k8s.io", "resourceslices", verb)


@pytest.mark.parametrize("mig", [False, True])
def test_device_plugin_can_read_mig_devices_only_when_mig_is_used(mig: bool) -> None:
    """The chart (templates/_helpers.tpl, daemonset-device-plugin.yml@v0.20.0) adds
    NVIDIA_MIG_MONITOR_DEVICES=all and SYS_ADMIN whenever MIG is possible; without them the
    plugin exits 'error getting device memory info: Insufficient Permissions'. SYS_ADMIN is
    also what the chart gives the plugin with the volume-mounts device list strategy
    (requiresCapSysAdmin), which gpuk8s uses on every node (security review 2, L6): the
    toolkit counts it as privileged, so the plugin still sees its node's GPUs."""
    docs = _docs("gpu_cluster", "gpu/nvidia-device-plugin.yaml.j2", device_plugin_mig=mig)
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    ctr = next(c for c in ds["spec"]["template"]["spec"]["containers"]
               if c["name"] == "nvidia-device-plugin-ctr")
    sc = ctr["securityContext"]
    sys_admin = sc.get("privileged") is True or \
        "SYS_ADMIN" in (sc.get("capabilities") or {}).get("add", [])
    assert sys_admin
    assert (_env(ctr).get("NVIDIA_MIG_MONITOR_DEVICES") == "all") is mig
    assert _env(ctr)["DEVICE_LIST_STRATEGY"] == "volume-mounts"
    if not mig:
        assert sc == {"capabilities": {"add": ["SYS_ADMIN"]}}


def test_dcgm_exporter_runs_upstreams_own_image_variant() -> None:
    """dcgm-exporter.yaml and deployment/values.yaml@4.5.3-4.8.2 use -distroless; the tag is
    <DCGM>-<exporter>-<platform> (RELEASE.md)."""
    docs = _docs("monitoring", "monitoring/gpu-monitoring.yaml.j2", gpu_monitoring=True,
                 prometheus_config_sha256="")
    images = [c["image"] for d in docs if d["kind"] == "DaemonSet"
              for c in d["spec"]["template"]["spec"]["containers"]]
    assert "nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless" in images
