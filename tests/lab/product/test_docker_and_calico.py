"""Two choices of the inventory on one 2-node lab cluster (cp-01, gpu-01), bootstrapped once:
``container_runtime: docker`` and ``cni: calico`` (they touch different layers, so one cluster
proves both and CI bootstraps once instead of twice).

Docker: the nodes run Docker CE (the lab's docker-ce/docker-ce-cli: Debian's real dockerd and
docker CLI) on containerd.io's containerd, with containerd's CRI plugin on for the kubelet.

Calico: the pod network is gpuk8s's pinned Calico manifest (CRDs, RBAC, calico-node DaemonSet,
calico-kube-controllers). The lab's kubelet stand-in plays calico/cni's install-cni init
container: it writes the CNI config from the ConfigMap key the container's env names, so a wrong
or missing ConfigMap leaves the nodes NotReady.

The tests run in order and share one bootstrap from the "fresh" snapshot (made by
test_bootstrap.py, or here on a freshly booted lab when it is missing).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuk8s.errors import PhaseFailed, PlanError
from tests.lab.lab import Lab
from tests.lab.product.runs import bootstrap_inline, cut_inventory, restore_fresh, ssh_ok

pytestmark = pytest.mark.lab

NODES = ("cp-01", "gpu-01")
KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf"


@pytest.fixture(scope="module")
def variant_lab(lab: Lab) -> Lab:
    return restore_fresh(lab)


@pytest.fixture(scope="module")
def inventory(variant_lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cut_inventory(variant_lab, tmp_path_factory.mktemp("docker-calico"), NODES,
                         container_runtime="docker", cni="calico", pod_cidr="10.50.0.0/16")


@pytest.fixture(scope="module")
def first_run(variant_lab: Lab, inventory: Path) -> tuple[dict[str, Any], str]:
    return bootstrap_inline(inventory)


def test_bootstrap_with_docker_and_calico_succeeds(first_run: tuple[dict[str, Any], str]
                                                   ) -> None:
    result, text = first_run
    assert sorted(result["totals"]) == sorted(NODES), result["totals"]
    assert all(t["failed"] == 0 for t in result["totals"].values()), text
    assert result["changed"] > 20, text
    assert "docker-ce" in text
    assert "cni | calico" in text and "cni | flannel" not in text


# -- container_runtime: docker ---------------------------------------------------------------
def test_docker_ce_installed_from_the_lab_docker_repo(variant_lab: Lab, first_run: Any) -> None:
    for node in NODES:
        out = ssh_ok(variant_lab, node, "dpkg-query -W -f '${Package} ${Version} "
                      "${db:Status-Abbrev}\\n' docker-ce docker-ce-cli containerd.io "
                      "containerd runc 2>/dev/null; true")
        status = {ln.split()[0]: ln.split()[-1] for ln in out.splitlines() if ln.strip()}
        version = {ln.split()[0]: ln.split()[1] for ln in out.splitlines() if len(ln.split()) == 3}
        for name in ("docker-ce", "docker-ce-cli"):
            assert version[name].startswith("5:28."), (node, version)
        for name in ("docker-ce", "docker-ce-cli", "containerd.io"):
            assert status[name] == "hi", (node, status)  # installed and held
        # Debian's containerd/runc never come in (containerd.io provides and conflicts)
        for name in ("containerd", "runc"):
            assert status.get(name, "un")[1] != "i", (node, status)
        held = ssh_ok(variant_lab, node, "apt-mark showhold").split()
        assert {"docker-ce", "docker-ce-cli", "containerd.io"} <= set(held), (node, held)


def test_dockerd_runs_on_containerd_io(variant_lab: Lab, first_run: Any) -> None:
    for node in NODES:
        units = ssh_ok(variant_lab, node, "systemctl is-active docker.service docker.socket "
                        "containerd.service; systemctl is-enabled docker.service "
                        "containerd.service")
        assert units.split() == ["active"] * 3 + ["enabled"] * 2, (node, units)
        rc, info, err = variant_lab.ssh(node, "docker info --format '{{json .}}'")
        if rc != 0:
            _, log, _ = variant_lab.ssh(node, "journalctl -u docker --no-pager -n 60")
            pytest.fail(f"{node}: docker info failed: {err}\n{log}")
        info_j = json.loads(info)
        assert info_j["ServerVersion"].startswith("28."), info_j["ServerVersion"]
        print(f"{node}: dockerd {info_j['ServerVersion']}, storage driver {info_j['Driver']}, "
              f"cgroup {info_j.get('CgroupDriver')}/v{info_j.get('CgroupVersion')}, "
              f"warnings {info_j.get('Warnings')}")
        # dockerd uses the system containerd (containerd.io's), not one of its own
        cmdline = ssh_ok(variant_lab, node, "tr '\\0' ' ' < /proc/$(systemctl show -P MainPID "
                          "docker)/cmdline")
        assert "--containerd=/run/containerd/containerd.sock" in cmdline, cmdline
        procs = ssh_ok(variant_lab, node, "pgrep -a containerd || true")
        daemons = [ln for ln in procs.splitlines() if ln.split()[1].endswith("/containerd")]
        assert len(daemons) == 1 and daemons[0].split()[1] == "/usr/bin/containerd", procs
        version = ssh_ok(variant_lab, node, "containerd --version")
        assert " 2.1." in version, version
        # a container through the whole chain: docker -> containerd.io -> runc (an image
        # imported locally from the static docker-init: the lab has no registry)
        out = ssh_ok(variant_lab, node, (
            "set -e; d=$(mktemp -d); cp /usr/bin/docker-init $d/tini; "
            "tar -C $d -c tini | docker import - gpuk8s-lab/tini:1 >/dev/null; rm -r $d; "
            "docker run --rm --network none gpuk8s-lab/tini:1 /tini --version; "
            "ctr namespaces ls -q"), timeout=180)
        assert "tini version 0.19" in out, out
        assert "moby" in out.split(), f"{node}: dockerd's containers are not in containerd: {out}"


def test_containerd_cri_plugin_enabled(variant_lab: Lab, first_run: Any) -> None:
    for node in NODES:
        out = ssh_ok(variant_lab, node, "ctr plugins ls")
        cri = [ln.split() for ln in out.splitlines()
               if ln.split()[:2] == ["io.containerd.grpc.v1", "cri"]]
        assert cri and cri[0][-1] == "ok", f"{node}: {out}"
        config = ssh_ok(variant_lab, node, "cat /etc/containerd/config.toml")
        assert 'disabled_plugins = ["cri"]' not in config


def test_nodes_ready_with_gpus(variant_lab: Lab, first_run: Any) -> None:
    ssh_ok(variant_lab, "cp-01", f"{KUBECTL} wait --for=condition=Ready node/cp-01 node/gpu-01 "
            "--timeout=180s", timeout=240)
    ssh_ok(variant_lab, "cp-01", f"{KUBECTL} wait --for=jsonpath='{{.status.allocatable."
            "nvidia\\.com/gpu}'=2 node/gpu-01 --timeout=180s", timeout=240)
    nodes = json.loads(ssh_ok(variant_lab, "cp-01", f"{KUBECTL} get nodes -o json"))["items"]
    by_name = {n["metadata"]["name"]: n for n in nodes}
    assert sorted(by_name) == sorted(NODES)
    for name, n in by_name.items():
        ready = next(c for c in n["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", f"{name}: {ready}"
    gpus = {name: n["status"].get("allocatable", {}).get("nvidia.com/gpu")
            for name, n in by_name.items()}
    assert gpus == {"cp-01": None, "gpu-01": "2"}


# -- cni: calico ----------------------------------------------------------------------------
def test_nodes_ready_with_calico_cni_config(variant_lab: Lab, first_run: Any) -> None:
    ssh_ok(variant_lab, "cp-01", f"{KUBECTL} wait --for=condition=Ready node/cp-01 node/gpu-01 "
           "--timeout=180s", timeout=240)
    for node in NODES:
        listing = ssh_ok(variant_lab, node, "ls /etc/cni/net.d").split()
        assert listing == ["10-calico.conflist"], (node, listing)
        conf = json.loads(ssh_ok(variant_lab, node, "cat /etc/cni/net.d/10-calico.conflist"))
        calico = conf["plugins"][0]
        assert calico["type"] == "calico" and calico["nodename"] == node, conf
        assert calico["ipam"] == {"type": "calico-ipam"} and calico["mtu"] == 1450, conf
    # kubeadm's podSubnet and Calico's pool are the same range
    cm = ssh_ok(variant_lab, "cp-01", f"{KUBECTL} -n kube-system get configmap kubeadm-config "
                "-o jsonpath='{.data.ClusterConfiguration}'")
    assert "podSubnet: 10.50.0.0/16" in cm, cm
    ds = json.loads(ssh_ok(variant_lab, "cp-01", f"{KUBECTL} -n kube-system get daemonset "
                           "calico-node -o json"))
    env = {e["name"]: e.get("value") for e in ds["spec"]["template"]["spec"]["containers"][0]
           ["env"]}
    assert env["CALICO_IPV4POOL_CIDR"] == "10.50.0.0/16"


def test_calico_objects_and_gpus(variant_lab: Lab, first_run: Any) -> None:
    crds = ssh_ok(variant_lab, "cp-01", f"{KUBECTL} get customresourcedefinitions -o name")
    assert "customresourcedefinition.apiextensions.k8s.io/ippools.crd.projectcalico.org" \
        in crds.split(), crds
    pods = json.loads(ssh_ok(variant_lab, "cp-01", f"{KUBECTL} -n kube-system get pods "
                             "-l k8s-app=calico-node -o json"))["items"]
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(NODES), pods
    ssh_ok(variant_lab, "cp-01", f"{KUBECTL} -n kube-system get deployment "
           "calico-kube-controllers")
    # pods get sandboxes through Calico's CNI config: the device plugin runs, GPUs advertised
    ssh_ok(variant_lab, "cp-01", f"{KUBECTL} wait --for=jsonpath='{{.status.allocatable."
           "nvidia\\.com/gpu}'=2 node/gpu-01 --timeout=180s", timeout=240)


def test_second_bootstrap_changes_nothing(variant_lab: Lab, inventory: Path,
                                          first_run: Any) -> None:
    result, text = bootstrap_inline(inventory)
    assert all(t["failed"] == 0 for t in result["totals"].values()), text
    assert result["changed"] == 0, text
    assert "no changes" in text
    # docker is still up after the no-op run
    for node in NODES:
        ssh_ok(variant_lab, node, "docker info --format '{{.ServerVersion}}'")


def test_switching_to_flannel_is_refused_and_changes_nothing(
        variant_lab: Lab, inventory: Path, first_run: Any) -> None:
    before = ssh_ok(variant_lab, "cp-01", f"{KUBECTL} get daemonsets -A -o name")
    with pytest.raises(PlanError, match="the cluster runs calico, the inventory asks for "
                       "flannel"):
        bootstrap_inline(inventory, sets=["cni=flannel"])
    assert ssh_ok(variant_lab, "cp-01", f"{KUBECTL} get daemonsets -A -o name") == before
    assert "kube-flannel" not in before


def _without_bgpconfiguration_create(render: Any) -> Any:
    """gpuk8s's Calico manifest with the defect it shipped before: calico-node may not create
    BGPConfigurations (and a new pod template, so that its pods restart, as on a fresh
    install)."""
    def broken(role: str, name: str, context: Any) -> str:
        text = str(render(role, name, context))
        if name != "cni/calico.yaml.j2":
            return text
        for old, new in (("ippools, felixconfigurations, bgpconfigurations, clusterinformations]",
                          "ippools, felixconfigurations, clusterinformations]"),
                         ("resources: [bgpconfigurations, bgppeers]", "resources: [bgppeers]"),
                         ("      labels:\n        k8s-app: calico-node\n    spec:",
                          "      labels:\n        k8s-app: calico-node\n      annotations:\n"
                          "        gpuk8s.io/test: without-bgpconfiguration-create\n    spec:")):
            assert text.count(old) == 1, old
            text = text.replace(old, new)
        return text
    return broken


def test_calico_node_refused_its_bgpconfiguration_crash_loops_and_bootstrap_names_it(
        variant_lab: Lab, inventory: Path, first_run: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The lab's API server enforces RBAC on ServiceAccount tokens and its calico-node makes
    calico-node v3.32.1's start-up calls as its ServiceAccount: without `create` on
    bgpconfigurations it exits (CrashLoopBackOff) with the 403 in its log, and bootstrap's
    wait for the pod network fails naming it. With gpuk8s's manifest it converges again."""
    import gpuk8s.roles as roles

    monkeypatch.setattr(roles, "render", _without_bgpconfiguration_create(roles.render))
    # as on a fresh install: no default BGPConfiguration yet (the first calico-node made it)
    ssh_ok(variant_lab, "cp-01", f"{KUBECTL} delete bgpconfigurations.crd.projectcalico.org "
           "default")
    with pytest.raises(PhaseFailed) as err:
        bootstrap_inline(inventory, sets=["cni_ready_timeout=40"])
    text = str(err.value)
    print(text)
    assert "daemonset/calico-node in kube-system is not ready after 40s" in text
    assert 'cannot create resource "bgpconfigurations" in API group "crd.projectcalico.org" ' \
        "at the cluster scope" in text
    assert "startup/utils.go 47: Terminating" in text
    pods = json.loads(ssh_ok(variant_lab, "cp-01", f"{KUBECTL} -n kube-system get pods "
                             "-l k8s-app=calico-node -o json"))["items"]
    states = [c["state"] for p in pods for c in p["status"]["containerStatuses"]]
    assert any(s.get("waiting", {}).get("reason") == "CrashLoopBackOff" for s in states), states
    monkeypatch.undo()
    result, text = bootstrap_inline(inventory)
    assert all(t["failed"] == 0 for t in result["totals"].values()), text
    assert "wait until its agents are ready" in text
    ssh_ok(variant_lab, "cp-01", f"{KUBECTL} -n kube-system rollout status daemonset/calico-node "
           "--timeout=10s")
    logs = ssh_ok(variant_lab, "cp-01", f"{KUBECTL} -n kube-system logs daemonset/calico-node "
                  "-c calico-node")
    assert "Startup complete" in logs and "forbidden" not in logs, logs
    ssh_ok(variant_lab, "cp-01", f"{KUBECTL} get bgpconfigurations.crd.projectcalico.org "
           "default")
