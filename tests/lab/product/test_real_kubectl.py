"""The REAL kubectl 1.36 on a bootstrapped lab, as a lab admin types it (issue 15's acceptance).

Every node's kubectl is the lab package's real binary (Debian's build of the Kubernetes sources);
what answers it is the lab's API server stand-in. Each test asserts the real kubectl's exit code
and what it prints. The official Python client (`kubernetes` from PyPI) is the second real client.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.lab import registry
from tests.lab.lab import Lab
from tests.lab.paths import HOST_IP, node_ip
from tests.lab.product.test_day2 import restore_bootstrapped

pytestmark = pytest.mark.lab
NODES = {n: node_ip(i) for i, n in enumerate(("cp-01", "gpu-01", "gpu-02", "cpu-01"), 1)}
NS = "kubectl-e2e"
BUSYBOX = "docker.io/library/busybox:gpuk8s-lab"


@pytest.fixture(scope="module")
def cluster(lab: Lab) -> Lab:
    registry.push_busybox()
    return restore_bootstrapped(lab)


def k(lab: Lab, args: str, stdin: str | None = None, timeout: float = 120
      ) -> tuple[int, str, str]:
    """The real kubectl on cp-01 with the admin kubeconfig: (exit code, stdout, stderr)."""
    return lab.ssh("cp-01", f"kubectl --kubeconfig /etc/kubernetes/admin.conf {args}",
                   input=stdin, timeout=timeout)


def ok(lab: Lab, args: str, stdin: str | None = None, timeout: float = 120) -> str:
    rc, out, err = k(lab, args, stdin, timeout)
    assert rc == 0, f"kubectl {args}: {err}"
    return out


def test_the_nodes_kubectl_is_the_real_one(cluster: Lab) -> None:
    out = ok(cluster, "version --client")
    assert re.match(r"Client Version: v1\.36\.\d+\nKustomize Version: v\d", out), out
    rc, desc, _ = cluster.ssh("cp-01", "dpkg-query -W -f '${Version}\\n${Description}' kubectl")
    assert rc == 0 and "the REAL kubectl binary from Debian sid" in desc


def test_get_nodes_wide_columns(cluster: Lab) -> None:
    lines = ok(cluster, "get nodes -o wide").splitlines()
    assert re.split(r"\s{2,}", lines[0].strip()) == [
        "NAME", "STATUS", "ROLES", "AGE", "VERSION", "INTERNAL-IP", "EXTERNAL-IP", "OS-IMAGE",
        "KERNEL-VERSION", "CONTAINER-RUNTIME"]
    rows = {r.split()[0]: r.split() for r in lines[1:]}
    assert sorted(rows) == sorted(NODES)
    for name, ip in NODES.items():
        row = rows[name]
        assert row[1] == "Ready"
        assert row[2] == ("control-plane" if name == "cp-01" else "<none>")
        assert re.fullmatch(r"v1\.36\.\d+", row[4])
        assert row[5] == ip and row[6] == "<none>"
        assert row[-1].startswith("containerd://2.")


def test_describe_gpu_node(cluster: Lab) -> None:
    out = ok(cluster, "describe node gpu-01")
    alloc = out.split("\nAllocatable:\n", 1)[1].split("\nSystem Info:", 1)[0]
    assert re.search(r"^  nvidia\.com/gpu:\s+2$", alloc, re.M), alloc
    assert "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3" in out
    assert re.search(r"^Lease:\n  HolderIdentity:  gpu-01$", out, re.M)
    assert re.search(r"^  Ready\s+True\s", out, re.M)
    assert "nvidia-device-plugin-daemonset-" in out  # under Non-terminated Pods


def test_wait_all_nodes_and_rollout_status(cluster: Lab) -> None:
    out = ok(cluster, "wait --for=condition=Ready node --all --timeout=60s")
    assert sorted(out.splitlines()) == sorted(f"node/{n} condition met" for n in NODES)
    out = ok(cluster, "-n kube-system rollout status ds/nvidia-device-plugin-daemonset "
                      "--timeout=60s")
    assert out == 'daemon set "nvidia-device-plugin-daemonset" successfully rolled out\n'


def _web(replicas: int = 1) -> str:
    return yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "web", "namespace": NS},
         "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                  "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                      "nodeSelector": {"kubernetes.io/hostname": "cpu-01"},
                      "terminationGracePeriodSeconds": 2,
                      "containers": [{"name": "web", "image": BUSYBOX,
                                      "command": ["/bin/busybox", "sleep", "3600"]}]}}}},
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
         "metadata": {"name": "web", "namespace": NS},
         "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}}])


def test_drain_blocked_then_allowed_by_the_pdb(cluster: Lab, tmp_path: Path) -> None:
    """kubectl drain, then gpuk8s's reprovision (its drain), against a PodDisruptionBudget
    that blocks and then one that allows."""
    from gpuk8s import day2
    from gpuk8s.errors import Gpuk8sError
    from tests.lab.product.runs import call
    from tests.lab.product.test_bootstrap import GATES

    out = ok(cluster, "apply -f -", stdin=_web())
    assert out.splitlines() == [f"namespace/{NS} created", "deployment.apps/web created",
                                "poddisruptionbudget.policy/web created"]
    data = yaml.safe_load(cluster.inventory_path.read_text())
    data["all"]["vars"]["feature_gates"] = yaml.safe_load(GATES.split("=", 1)[1])
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        ok(cluster, f"-n {NS} rollout status deploy/web --timeout=180s", timeout=200)
        # kubectl exec into the real container (its websocket, the kubelet's ctr task exec)
        assert ok(cluster, f"-n {NS} exec deploy/web -- /bin/busybox echo hello") == "hello\n"
        rc, out, err = k(cluster, f"-n {NS} exec deploy/web -- /bin/busybox sh -c "
                                  "'echo oops >&2; exit 3'")
        assert rc == 3 and "oops\n" in err, err
        assert err.endswith("command terminated with exit code 3\n"), err
        # gpuk8s's drain (reprovision) stops, names the blocking pod and changes nothing else
        with pytest.raises(Gpuk8sError) as exc:
            call(day2.reprovision, inv, "cpu-01", drain_timeout=12, yes=True)
        msg = str(exc.value)
        assert re.search(r"cpu-01: drain did not finish in 12s; blocked by "
                         r"kubectl-e2e/web-\S+", msg), msg
        assert "fix: relax the PodDisruptionBudget" in msg
        assert ok(cluster, "get node cpu-01").splitlines()[1].split()[1] == \
            "Ready,SchedulingDisabled"  # still there, still Ready: never deleted nor reset
        ok(cluster, "uncordon cpu-01")
        rc, out, err = k(cluster, "drain cpu-01 --ignore-daemonsets --delete-emptydir-data "
                                  "--timeout=12s", timeout=60)
        assert rc == 1
        assert out.splitlines()[0] == "node/cpu-01 cordoned"
        assert re.search(r'error when evicting pods/"web-[a-z0-9]+-[a-z0-9]+" -n "kubectl-e2e" '
                         r"\(will retry after 5s\): Cannot evict pod as it would violate the "
                         r"pod's disruption budget\.", err), err
        assert "global timeout reached: 12s" in err
        assert ok(cluster, "get node cpu-01").splitlines()[1].split()[1] == \
            "Ready,SchedulingDisabled"
        # the budget allows one away: the same drain goes through
        assert ok(cluster, f"-n {NS} patch pdb web --type=merge -p "
                           "'{\"spec\":{\"minAvailable\":null,\"maxUnavailable\":1}}'") == \
            "poddisruptionbudget.policy/web patched\n"
        rc, out, err = k(cluster, "drain cpu-01 --ignore-daemonsets --delete-emptydir-data "
                                  "--timeout=90s", timeout=120)
        assert rc == 0, err
        assert out.splitlines()[0] == "node/cpu-01 already cordoned"
        assert re.search(r"^pod/web-\S+ evicted$", out, re.M), out
        assert out.splitlines()[-1] == "node/cpu-01 drained"
        assert "Warning: ignoring DaemonSet-managed Pods: " in err
        # with the budget allowing it, gpuk8s reprovisions the node through the same drain
        ok(cluster, "uncordon cpu-01")
        ok(cluster, f"-n {NS} rollout status deploy/web --timeout=180s", timeout=200)
        result, _ = call(day2.reprovision, inv, "cpu-01", drain_timeout=90, yes=True)
        assert result["changed"] > 0
        assert ok(cluster, "get node cpu-01").splitlines()[1].split()[1] == "Ready"
    finally:
        k(cluster, "uncordon cpu-01")
        k(cluster, f"delete namespace {NS} --wait=false")
    assert ok(cluster, "get node cpu-01").splitlines()[1].split()[1] == "Ready"


def test_server_side_apply_by_two_managers(cluster: Lab) -> None:
    cm = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ssa-demo, namespace: default}\n"
    try:
        assert ok(cluster, "apply --server-side --field-manager=alice -f -",
                  stdin=cm + "data: {color: red}\n") == "configmap/ssa-demo serverside-applied\n"
        rc, out, err = k(cluster, "apply --server-side --field-manager=bob -f -",
                         stdin=cm + "data: {color: blue}\n")
        assert rc == 1 and out == ""
        assert err.startswith('error: Apply failed with 1 conflict: conflict with "alice": '
                              ".data.color\nPlease review the fields above--they currently have "
                              "other managers."), err
        assert "--force-conflicts" in err
        assert ok(cluster, "apply --server-side --field-manager=bob --force-conflicts -f -",
                  stdin=cm + "data: {color: blue}\n") == "configmap/ssa-demo serverside-applied\n"
        assert ok(cluster, "get cm ssa-demo -o jsonpath='{.data.color}'") == "blue"
        managers = ok(cluster, "get cm ssa-demo --show-managed-fields -o "
                               "jsonpath='{range .metadata.managedFields[*]}{.manager}:"
                               "{.operation} {end}'").split()
        assert managers == ["bob:Apply"]  # alice owned only the color bob took
    finally:
        k(cluster, "delete cm ssa-demo --ignore-not-found")


def test_apply_with_an_unknown_field_is_refused(cluster: Lab) -> None:
    bad = ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: typo, namespace: default}\n"
           "data: {a: b}\ndatta: {c: d}\n")
    rc, out, err = k(cluster, "apply -f -", stdin=bad)
    assert rc == 1 and out == ""
    assert err.strip() == (
        'Error from server (BadRequest): error when creating "STDIN": ConfigMap in version "v1" '
        'cannot be handled as a ConfigMap: strict decoding error: unknown field "datta"')
    rc, out, err = k(cluster, "apply --server-side -f -", stdin=bad)
    assert rc == 1
    assert err.strip() == ("Error from server: failed to create typed patch object "
                           "(default/typo; /v1, Kind=ConfigMap): .datta: field not declared in "
                           "schema")
    rc, _, err = k(cluster, "get cm typo")
    assert rc == 1 and err.strip() == 'Error from server (NotFound): configmaps "typo" not found'


def test_auth_can_i_and_whoami(cluster: Lab) -> None:
    assert ok(cluster, "auth can-i '*' '*'") == "yes\n"
    out = ok(cluster, "auth whoami")
    assert re.search(r"^Username\s+kubernetes-admin$", out, re.M), out
    rc, out, _ = k(cluster, "--kubeconfig /etc/kubernetes/kubelet.conf auth can-i create "
                            "deployments -n default")
    assert rc == 1 and out == "no\n"


# ------------------------------------------------------------------ the official Python client
def _python_client(cluster: Lab, tmp_path: Path) -> Any:
    kubernetes = pytest.importorskip("kubernetes", reason="scripts/setup installs the dev extras")
    rc, conf, err = cluster.ssh("cp-01", "cat /etc/kubernetes/admin.conf")
    assert rc == 0, err
    path = tmp_path / "admin.conf"
    path.write_text(conf)
    return kubernetes, kubernetes.config.new_client_from_config(str(path))


def test_official_python_client_list_watch_apply(cluster: Lab, tmp_path: Path) -> None:
    kubernetes, api_client = _python_client(cluster, tmp_path)
    assert HOST_IP  # the lab host reaches cp-01's API server over the lab bridge
    core = kubernetes.client.CoreV1Api(api_client)
    nodes = core.list_node()
    assert sorted(n.metadata.name for n in nodes.items) == sorted(NODES)
    gpu01 = next(n for n in nodes.items if n.metadata.name == "gpu-01")
    assert gpu01.status.allocatable["nvidia.com/gpu"] == "2"
    # a watch from the list's resourceVersion sees a label change as MODIFIED
    w = kubernetes.watch.Watch()
    core.patch_node("gpu-02", {"metadata": {"labels": {"gpuk8s-e2e": "1"}}})
    seen = []
    try:
        for ev in w.stream(core.list_node, resource_version=nodes.metadata.resource_version,
                           timeout_seconds=10):
            seen.append((ev["type"], ev["object"].metadata.name))
            if ("MODIFIED", "gpu-02") in seen and (ev["object"].metadata.labels or {}).get(
                    "gpuk8s-e2e") == "1":
                break
    finally:
        w.stop()
        core.patch_node("gpu-02", {"metadata": {"labels": {"gpuk8s-e2e": None}}})
    assert ("MODIFIED", "gpu-02") in seen
    # create and delete a namespace
    ns = kubernetes.client.V1Namespace(metadata=kubernetes.client.V1ObjectMeta(name="pyclient"))
    created = core.create_namespace(ns)
    assert created.status.phase == "Active"
    with pytest.raises(kubernetes.client.ApiException) as exc:
        core.create_namespace(ns)
    assert exc.value.status == 409 and '"reason":"AlreadyExists"' in exc.value.body.replace(
        " ", "")
    core.delete_namespace("pyclient")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if "pyclient" not in [n.metadata.name for n in core.list_namespace().items]:
            break
        time.sleep(1)
    else:
        raise AssertionError("namespace pyclient never went away")
    # server-side apply through the dynamic client, twice: the second changes nothing
    dyn = kubernetes.dynamic.DynamicClient(api_client)
    cms = dyn.resources.get(api_version="v1", kind="ConfigMap")
    body = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "pyclient-ssa", "namespace": "default"}, "data": {"k": "v"}}
    try:
        first = cms.server_side_apply(body=body, name="pyclient-ssa", namespace="default",
                                      field_manager="pyclient")
        second = cms.server_side_apply(body=body, name="pyclient-ssa", namespace="default",
                                       field_manager="pyclient")
        assert first.data.k == "v"
        assert [e.manager for e in second.metadata.managedFields] == ["pyclient"]
    finally:
        core.delete_namespaced_config_map("pyclient-ssa", "default")


def test_gpuk8s_untaints_the_control_plane_with_the_real_kubectl(cluster: Lab) -> None:
    """control_plane_schedulable: gpuk8s's `kubectl taint nodes --all ...-` through the real
    binary (last in this module: the taint stays off, the next module restores the lab)."""
    import io

    from gpuk8s import api
    from gpuk8s.report import Reporter
    from tests.lab.product.test_bootstrap import GATES

    taints = "get node cp-01 -o jsonpath='{.spec.taints[*].key}'"
    assert ok(cluster, taints) == "node-role.kubernetes.io/control-plane"
    out = io.StringIO()
    api.bootstrap(cluster.inventory_path, sets=[GATES, "control_plane_schedulable=true"],
                  yes=True, reporter=Reporter(out))
    assert "remove the control-plane NoSchedule taint" in out.getvalue()
    assert ok(cluster, taints) == ""
    again = io.StringIO()
    api.bootstrap(cluster.inventory_path, sets=[GATES, "control_plane_schedulable=true"],
                  yes=True, reporter=Reporter(again))
    assert "no changes" in again.getvalue()
