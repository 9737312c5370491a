"""The API server stand-in with a REAL etcd of its own, through the real kubectl: tables, apply,
CRDs, scheduling events, jobs, labels and taints, drain, TLS, persistence; two API servers on
one etcd; a write based on a stale read refused; an unknown feature gate refused."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from k8s import kubeconfig, pki

from tests.lab.repos import real_kubectl
from tests.lab.selftest.standins import k8s_helpers
from tests.lab.selftest.standins.k8s_helpers import (
    CP_TAINT,
    NEEDS_OPENSSL,
    STANDINS,
    Cluster,
    free_port,
    gpu_pod,
    kubectl_ok,
    wait_for,
)

pytestmark = NEEDS_OPENSSL


class TestApiServerKubectl:
    def test_get_nodes_table_json_notfound(self, cluster: Cluster) -> None:
        cluster.add_node("gpu-01", gpus=2)
        r = cluster.kubectl("get", "nodes")
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
        assert lines[1].split()[:3] == ["gpu-01", "Ready", "<none>"]
        assert lines[1].endswith("v1.36.2")
        js = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)
        assert js["kind"] == "List"
        assert js["items"][0]["status"]["allocatable"]["nvidia.com/gpu"] == "2"
        r = cluster.kubectl("get", "node", "nope", "-o", "json")
        assert r.returncode == 1
        assert r.stderr.strip() == 'Error from server (NotFound): nodes "nope" not found'
        r = cluster.kubectl("get", "daemonset", "nope", "-n", "kube-system", "-o", "json")
        assert r.stderr.strip() == ('Error from server (NotFound): daemonsets.apps "nope" not '
                                    "found")

    def test_version_metrics_raw(self, cluster: Cluster) -> None:
        v = json.loads(cluster.kubectl("version", "--client", "-o", "json").stdout)
        assert v["clientVersion"]["gitVersion"].startswith("v1.")
        metrics = cluster.kubectl("get", "--raw", "/metrics").stdout
        assert 'kubernetes_feature_enabled{name="DRAPartitionableDevices",stage="BETA"} 1' in \
            metrics
        assert json.loads(cluster.kubectl("get", "--raw", "/version").stdout)["gitVersion"]

    def test_apply_server_side_and_unknown_kind(self, cluster: Cluster) -> None:
        cluster.add_node("gpu-01", gpus=1)
        manifest = """apiVersion: apps/v1
kind: DaemonSet
metadata: {name: nvidia-device-plugin-daemonset, namespace: kube-system}
spec:
  selector: {matchLabels: {name: nvidia-device-plugin-ds}}
  template:
    metadata: {labels: {name: nvidia-device-plugin-ds}}
    spec:
      tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
      containers:
      - {name: nvidia-device-plugin-ctr, image: nvcr.io/nvidia/k8s-device-plugin:v0.20.0}
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: nvidia}
handler: nvidia
"""
        r = cluster.kubectl("apply", "--server-side", "--force-conflicts",
                            "--field-manager=gpuk8s", "-f", "-", stdin=manifest)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == [
            "daemonset.apps/nvidia-device-plugin-daemonset serverside-applied",
            "runtimeclass.node.k8s.io/nvidia serverside-applied"]
        pods = cluster.wait(lambda: cluster.client.get(
            "/api/v1/namespaces/kube-system/pods")["items"])
        assert pods[0]["metadata"]["name"].startswith("nvidia-device-plugin-daemonset-")
        cluster.wait(lambda: cluster.client.get(
            "/api/v1/namespaces/kube-system/pods")["items"][0]["spec"].get("nodeName"))
        r = cluster.kubectl("apply", "--server-side", "-f", "-",
                            stdin="apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n")
        assert r.returncode == 1
        assert 'no matches for kind "Widget" in version "example.com/v1"' in r.stderr
        r = cluster.kubectl("delete", "-f", "-", "--ignore-not-found", stdin=manifest)
        assert r.returncode == 0, r.stderr
        r = cluster.kubectl("delete", "-f", "-", "--ignore-not-found", stdin=manifest)
        assert r.returncode == 0 and r.stdout == ""
        cluster.wait(lambda: not cluster.client.get(
            "/api/v1/namespaces/kube-system/pods")["items"])

    def test_crd_then_custom_resource(self, cluster: Cluster) -> None:
        crd = """apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {kind: Widget, plural: widgets, singular: widget}
  versions: [{name: v1, served: true, storage: true}]
"""
        assert cluster.kubectl("apply", "--server-side", "-f", "-", stdin=crd).returncode == 0
        r = cluster.kubectl("apply", "--server-side", "-f", "-", stdin=(
            "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w, namespace: default}\n"))
        assert r.stdout.strip() == "widget.example.com/w serverside-applied", r.stderr
        assert cluster.kubectl("get", "widgets", "w", "-o", "name").stdout == \
            "widget.example.com/w\n"

    def test_failed_scheduling_event_in_describe(self, cluster: Cluster) -> None:
        cluster.add_node("cp-01", taints=[CP_TAINT])
        cluster.add_node("gpu-01", gpus=2)
        cluster.client.request("POST", "/api/v1/namespaces/default/pods", gpu_pod("big", 4))
        pod = cluster.wait(lambda: next((c for c in cluster.client.get(
            "/api/v1/namespaces/default/pods/big").get("status", {}).get("conditions") or []
            if c["type"] == "PodScheduled"), None))
        assert (pod["status"], pod["reason"]) == ("False", "Unschedulable")
        out = cluster.kubectl("describe", "pod", "big", "-n", "default").stdout
        events = out[out.index("Events:"):].splitlines()
        assert events[1].split() == ["Type", "Reason", "Age", "From", "Message"]
        assert "Warning  FailedScheduling" in events[3]
        assert events[3].endswith(
            "default-scheduler  0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) "
            "had untolerated taint(s). no new claims to deallocate, preemption: 0/2 nodes are "
            "available: 1 No preemption victims found for incoming pod, 1 Preemption is not "
            "helpful for scheduling.")
        assert cluster.kubectl("get", "pod", "big", "-o",
                               "jsonpath={.status.phase}").stdout == "Pending"

    def test_indexed_job(self, cluster: Cluster) -> None:
        cluster.add_node("gpu-01", gpus=2)
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "tf"},
               "spec": {"completions": 2, "parallelism": 2, "completionMode": "Indexed",
                        "template": {"spec": {"containers": [{"name": "w", "image": "tf"}]}}}}
        cluster.client.request("POST", "/apis/batch/v1/namespaces/default/jobs", job)
        pods = cluster.wait(lambda: [p for p in cluster.client.get(
            "/api/v1/namespaces/default/pods")["items"]] if len(cluster.client.get(
                "/api/v1/namespaces/default/pods")["items"]) == 2 else None)
        hosts = sorted(p["spec"]["hostname"] for p in pods)
        assert hosts == ["tf-0", "tf-1"]
        env = pods[0]["spec"]["containers"][0]["env"]
        assert env[0]["name"] == "JOB_COMPLETION_INDEX"
        for p in pods:  # what the kubelet does when the container exits 0
            p["status"]["phase"] = "Succeeded"
            cluster.client.request("PUT", f"/api/v1/namespaces/default/pods/"
                                   f"{p['metadata']['name']}/status", p)
        r = cluster.kubectl("wait", "--for=condition=Complete", "job/tf", "--timeout=10s")
        assert r.stdout.strip() == "job.batch/tf condition met", r.stderr

    def test_label_taint_cordon_wait(self, cluster: Cluster) -> None:
        cluster.add_node("gpu-01")
        assert cluster.kubectl("label", "node", "gpu-01", "gpu=true").stdout == \
            "node/gpu-01 labeled\n"
        r = cluster.kubectl("label", "node", "gpu-01", "gpu=false")
        assert r.stderr.strip() == "error: 'gpu' already has a value (true), and --overwrite " \
            "is false"
        assert cluster.kubectl("label", "node", "gpu-01", "gpu=false", "--overwrite"
                               ).returncode == 0
        assert cluster.kubectl("taint", "node", "gpu-01", "nvidia.com/gpu=present:NoSchedule"
                               ).stdout == "node/gpu-01 tainted\n"
        assert cluster.kubectl("taint", "node", "gpu-01", "nvidia.com/gpu:NoSchedule-"
                               ).stdout == "node/gpu-01 untainted\n"
        r = cluster.kubectl("taint", "node", "gpu-01", "nvidia.com/gpu:NoSchedule-")
        assert r.returncode == 1 and 'taint "nvidia.com/gpu:NoSchedule" not found' in r.stderr
        assert cluster.kubectl("cordon", "gpu-01").stdout == "node/gpu-01 cordoned\n"
        assert "Ready,SchedulingDisabled" in cluster.kubectl("get", "nodes").stdout
        assert cluster.kubectl("uncordon", "gpu-01").stdout == "node/gpu-01 uncordoned\n"
        r = cluster.kubectl("wait", "--for=condition=Ready", "node/gpu-01", "--timeout=5s")
        assert r.stdout == "node/gpu-01 condition met\n"
        cluster.add_node("gpu-02", ready=False)
        r = cluster.kubectl("wait", "--for=condition=Ready", "node/gpu-02", "--timeout=1s")
        assert r.returncode == 1
        assert r.stderr.strip() == "error: timed out waiting for the condition on nodes/gpu-02"

    def test_drain_daemonsets_and_pdb(self, cluster: Cluster) -> None:
        cluster.add_node("gpu-01")
        c = cluster.client
        c.request("POST", "/apis/apps/v1/namespaces/kube-system/daemonsets", {
            "metadata": {"name": "proxy"}, "spec": {
                "selector": {"matchLabels": {"a": "p"}}, "template": {
                    "metadata": {"labels": {"a": "p"}},
                    "spec": {"containers": [{"name": "c", "image": "x"}]}}}})
        c.request("POST", "/apis/apps/v1/namespaces/default/deployments", {
            "metadata": {"name": "web"}, "spec": {
                "replicas": 1, "selector": {"matchLabels": {"app": "web"}}, "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "c", "image": "x"}]}}}})
        c.request("POST", "/apis/policy/v1/namespaces/default/poddisruptionbudgets", {
            "metadata": {"name": "web"}, "spec": {"minAvailable": 1,
                                                  "selector": {"matchLabels": {"app": "web"}}}})
        pods = cluster.wait(lambda: (lambda items: items if len(items) == 2 and all(
            p["spec"].get("nodeName") for p in items) else None)(
                c.get("/api/v1/pods")["items"]))
        for p in pods:  # the kubelet would report them Running and Ready
            p["status"].update({"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True"}]})
            c.request("PUT", f"/api/v1/namespaces/{p['metadata']['namespace']}/pods/"
                      f"{p['metadata']['name']}/status", p)
        row = cluster.wait(lambda: (lambda r: r if r[3] == "0" and r[1] == "1" else None)(
            kubectl_ok(cluster, "get", "pdb", "web").splitlines()[1].split()))
        assert row[:4] == ["web", "1", "N/A", "0"]  # MIN AVAILABLE, MAX UNAVAILABLE, ALLOWED
        r = cluster.kubectl("drain", "gpu-01", "--timeout=2s")
        assert r.returncode == 1
        assert "cannot delete DaemonSet-managed Pods (use --ignore-daemonsets to ignore)" in \
            r.stderr
        r = cluster.kubectl("drain", "gpu-01", "--ignore-daemonsets", "--delete-emptydir-data",
                            "--timeout=2s")
        assert r.returncode == 1
        assert "Cannot evict pod as it would violate the pod's disruption budget." in r.stderr
        assert "global timeout reached: 2s" in r.stderr
        c.request("DELETE", "/apis/policy/v1/namespaces/default/poddisruptionbudgets/web")
        r = cluster.kubectl("drain", "gpu-01", "--ignore-daemonsets", "--delete-emptydir-data",
                            "--timeout=10s")
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[0] == "node/gpu-01 already cordoned"
        assert r.stdout.splitlines()[-1] == "node/gpu-01 drained"
        assert "Warning: ignoring DaemonSet-managed Pods: kube-system/proxy-" in r.stderr, (
            r.stdout, c.get("/api/v1/pods"))

    def test_connection_refused_text(self, tmp_path: Path, cluster: Cluster) -> None:
        port = free_port()
        kc = tmp_path / "dead.conf"
        kc.write_text(cluster.kubeconfig.read_text().replace(f":{cluster.port}", f":{port}"))
        r = subprocess.run([str(real_kubectl()), "--kubeconfig", str(kc), "get",
                            "nodes"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 1
        assert r.stderr.strip().splitlines()[-1] == (
            f"The connection to the server 127.0.0.1:{port} was refused - did you specify the "
            "right host or port?")

    def test_tls_verified_against_kubeconfig_ca(self, tmp_path: Path, cluster: Cluster) -> None:
        other = tmp_path / "other"
        other.mkdir()
        pki.gen_ca(str(other / "ca.crt"), str(other / "ca.key"))
        kc = tmp_path / "wrongca.conf"
        creds = kubeconfig.load(str(cluster.kubeconfig))
        kc.write_text(kubeconfig.build(cluster.server, (other / "ca.crt").read_text(), "x",
                                       cert_pem=creds.cert_pem, key_pem=creds.key_pem))
        r = subprocess.run([str(real_kubectl()), "--kubeconfig", str(kc), "get",
                            "nodes"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 1
        assert "Unable to connect to the server: tls: failed to verify certificate" in r.stderr

    def test_persistence_survives_restart(self, tmp_path: Path, cluster: Cluster) -> None:
        cluster.add_node("gpu-01")
        cluster.proc.terminate()
        cluster.proc.wait(10)
        cluster.proc = cluster.launch()
        assert cluster.wait_listening(), "its port was taken while it restarted"
        cluster.wait(lambda: cluster.kubectl("get", "node", "gpu-01").returncode == 0)


def test_two_api_servers_share_one_etcd(tmp_path: Path) -> None:
    """Two control planes' API servers on one REAL etcd: what one writes the other serves and
    watches; one of them leads the controllers (the Lease kube-system/kube-controller-manager),
    and the other takes the lead once the leader stops renewing it."""
    env = {"GPUK8S_LAB_LEASE_SECONDS": "3"}
    a = Cluster(tmp_path / "a", env=env)
    b = Cluster(tmp_path / "b", etcd_port=a.etcd_port, env=env)
    try:
        watch = subprocess.Popen(
            [str(real_kubectl()), "--kubeconfig", str(b.kubeconfig), "get", "configmaps",
             "--watch-only", "--output-watch-events", "-o", "name", "--request-timeout=8s"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)
        r = a.kubectl("create", "configmap", "shared", "--from-literal=k=v")
        assert r.returncode == 0, r.stderr
        assert wait_for(lambda: b.kubectl("get", "configmap", "shared", "-o",
                                          "jsonpath={.data.k}").stdout == "v")
        out, _ = watch.communicate(timeout=30)
        # streamed by b as a wrote it (the root CA publisher's kube-root-ca.crt, should the
        # controllers' first pass come after the watch started, aside)
        assert [n for n in out.splitlines() if n != "configmap/kube-root-ca.crt"] == [
            "configmap/shared"]
        lease = "jsonpath={.spec.holderIdentity}"
        holder = wait_for(lambda: a.kubectl("get", "lease", "-n", "kube-system",
                                            "kube-controller-manager", "-o", lease).stdout)
        assert holder == b.kubectl("get", "lease", "-n", "kube-system",
                                   "kube-controller-manager", "-o", lease).stdout
        leader, other = (a, b) if a.ident() == holder else (b, a)
        assert other.ident() != holder
        leader.proc.terminate()  # its API server only: the etcd (a's) stays up
        leader.proc.wait(10)
        assert wait_for(lambda: other.kubectl("get", "lease", "-n", "kube-system",
                                              "kube-controller-manager", "-o", lease
                                              ).stdout == other.ident(), timeout=30)
        transitions = other.kubectl("get", "lease", "-n", "kube-system", "kube-controller-manager",
                                    "-o", "jsonpath={.spec.leaseTransitions}").stdout
        assert transitions == "1"
    finally:
        for c in (b, a):
            with contextlib.suppress(Exception):
                c.stop()


def test_a_write_based_on_a_stale_read_is_refused_by_etcd(tmp_path: Path) -> None:
    """store.py's transactions: a change based on a revision another API server has since
    overwritten is refused by etcd itself (the compare of the transaction), not merged."""
    c = Cluster(tmp_path / "c")
    try:
        from k8s.store import Conflict, Store

        one = Store(f"http://127.0.0.1:{c.etcd_port}")
        two = Store(f"http://127.0.0.1:{c.etcd_port}")
        key = ("", "configmaps")
        one.put(key, {"metadata": {"name": "x", "namespace": "default"}, "data": {"n": "1"}})
        wait_for(lambda: two.get(key, "default", "x"))
        stale = two.get(key, "default", "x")
        fresh = one.get(key, "default", "x")
        assert stale is not None and fresh is not None
        fresh["data"]["n"] = "2"
        one.put(key, fresh)
        stale["data"]["n"] = "3"
        with pytest.raises(Conflict):
            two.put(key, stale)
        assert wait_for(lambda: (two.get(key, "default", "x") or {}).get("data") == {"n": "2"})
    finally:
        c.stop()


def test_a_read_after_another_servers_create_finds_the_object(tmp_path: Path) -> None:
    """A client that creates through one API server and reads through another (kubeadm join's
    CSR behind HAProxy) finds the object, as the real server's quorum read does, even while
    the second server's cache lags (its watch held back here for a second): a miss waits
    until the cache holds etcd's current revision. CI's test_ha saw that 404."""
    import threading

    c = Cluster(tmp_path / "c")
    try:
        from k8s.store import Store

        gate = threading.Event()

        class Lagging(Store):
            def _watch_forever(self) -> None:
                gate.wait()
                super()._watch_forever()

        one = Store(f"http://127.0.0.1:{c.etcd_port}")
        two = Lagging(f"http://127.0.0.1:{c.etcd_port}")
        key = ("", "configmaps")
        one.put(key, {"metadata": {"name": "csr-like", "namespace": "default"}})
        assert two.get(key, "default", "csr-like") is None   # its cache lags
        threading.Timer(1.0, gate.set).start()
        started = time.monotonic()
        two.catch_up()
        assert two.get(key, "default", "csr-like") is not None
        assert 0.9 < time.monotonic() - started < 10
    finally:
        c.stop()


def test_apiserver_refuses_unknown_feature_gate(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "k8s.apiserver", "--feature-gates=Accelerators=true",
                        ], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(STANDINS)}, timeout=30)
    assert r.returncode == 1
    assert r.stderr.strip() == ('Error: invalid argument "Accelerators=true" for '
                                '"--feature-gates" flag: unrecognized feature gate: Accelerators')


def test_a_port_taken_before_the_server_binds_it_gets_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """free_port's port can be taken by another process before the API server binds it (CI of
    8ef863b). The harness must not take the other listener for the server: it starts the
    server again on another port, and requests reach the server."""
    stranger = socket.socket()
    stranger.bind(("127.0.0.1", 0))
    stranger.listen()
    taken = stranger.getsockname()[1]
    ports = iter([taken])
    real = k8s_helpers.free_port
    monkeypatch.setattr(k8s_helpers, "free_port", lambda: next(ports, None) or real())
    try:
        c = Cluster(tmp_path / "c")
        try:
            assert c.port != taken
            c.add_node("gpu-01")
            assert c.client.get("/api/v1/nodes/gpu-01")["metadata"]["name"] == "gpu-01"
        finally:
            c.stop()
    finally:
        stranger.close()


def test_node_restriction_a_kubelet_may_cordon_and_label_its_node_but_not_taint_it() -> None:
    """NodeRestriction's admitNode (plugin/pkg/admission/noderestriction/admission.go): a node
    changes only its own Node, and never its taints; the Xid watch relies on both."""
    import pytest

    from tests.lab.standins.k8s.admission import UserInfo
    from tests.lab.standins.k8s.apiserver import ApiServer, HTTPError
    from tests.lab.standins.k8s.resources import Resource

    nodes = Resource("", "v1", "Node", "nodes", False)
    kubelet = UserInfo("system:node:gpu-02", ("system:nodes", "system:authenticated"))
    old = {"metadata": {"name": "gpu-02"},
           "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}}
    cordoned = {"metadata": {"name": "gpu-02", "labels": {"gpuk8s.io/gpu-unhealthy": "xid-79"}},
                "spec": {**old["spec"], "unschedulable": True}}
    ApiServer.node_restriction(kubelet, "UPDATE", nodes, "gpu-02", cordoned, old, "")
    tainted = {"metadata": {"name": "gpu-02"}, "spec": {"taints": [
        *old["spec"]["taints"], {"key": "gpuk8s.io/gpu-unhealthy", "effect": "NoSchedule"}]}}
    with pytest.raises(HTTPError, match='node "gpu-02" is not allowed to modify taints'):
        ApiServer.node_restriction(kubelet, "UPDATE", nodes, "gpu-02", tainted, old, "")
    with pytest.raises(HTTPError, match='node "gpu-02" is not allowed to modify node "gpu-01"'):
        ApiServer.node_restriction(kubelet, "UPDATE", nodes, "gpu-01", cordoned, old, "")
    admin = UserInfo("kubernetes-admin", ("kubeadm:cluster-admins", "system:authenticated"))
    ApiServer.node_restriction(admin, "UPDATE", nodes, "gpu-02", tainted, old, "")
    ApiServer.node_restriction(kubelet, "UPDATE", nodes, "gpu-02", tainted, old, "status")


@pytest.mark.parametrize("value", ["true", "True", "1", "t"])
def test_a_watch_flag_is_parsed_as_go_parses_a_bool(cluster: Cluster, value: str) -> None:
    """kubernetes_asyncio (KubeSpawner's client) asks ``?watch=True``: the real server's
    strconv.ParseBool takes it, so a watch stream answers, not a List."""
    kubectl_ok(cluster, "create", "namespace", "w")
    first = next(iter(cluster.client.stream(
        f"/api/v1/namespaces?watch={value}&timeoutSeconds=2", idle=10)))
    event = json.loads(first)
    assert event["type"] == "ADDED" and event["object"]["kind"] == "Namespace"
