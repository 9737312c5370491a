"""The REAL kubectl's view of the API server stand-in: the tables an admin lists, watches, patch
types, server-side apply, strict field validation, status bodies and reviews, exec over the
websocket, discovery."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from k8s import kubeconfig, pki

from tests.lab.repos import real_kubectl
from tests.lab.selftest.standins.k8s_helpers import NEEDS_OPENSSL, Cluster, kubectl_ok, wait_for

pytestmark = NEEDS_OPENSSL


DEPLOY = """apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: c, image: "registry.example/web:1"}]
"""


class TestRealKubectl:
    """The real kubectl 1.36 against the API server stand-in: what it asks for (Tables, watches,
    patches, server-side apply, validation, reviews) and the real texts it prints back."""

    def test_tables_of_the_kinds_an_admin_lists(self, cluster: Cluster) -> None:
        cluster.add_node("gpu-01", gpus=2)
        kubectl_ok(cluster, "apply", "-f", "-", stdin=DEPLOY + """---
apiVersion: batch/v1
kind: Job
metadata: {name: once, namespace: default}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: "registry.example/job:1"}]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: default}
spec:
  accessModes: [ReadWriteMany]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, namespace: default}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      nodeSelector: {gpu: "yes"}
      containers: [{name: a, image: "registry.example/agent:1"}]
""")
        heads = {
            "deployments": ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE", "CONTAINERS",
                            "IMAGES", "SELECTOR"],
            "jobs": ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE", "CONTAINERS", "IMAGES",
                     "SELECTOR"],
            "services": ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE",
                         "SELECTOR"],
            "pvc": ["NAME", "STATUS", "VOLUME", "CAPACITY", "ACCESS MODES", "STORAGECLASS",
                    "VOLUMEATTRIBUTESCLASS", "AGE", "VOLUMEMODE"],
            "pods": ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE",
                     "NOMINATED NODE", "READINESS GATES"],
            "daemonsets": ["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE",
                           "NODE SELECTOR", "AGE", "CONTAINERS", "IMAGES", "SELECTOR"],
        }
        for kind, want in heads.items():
            out = kubectl_ok(cluster, "get", kind, "-o", "wide")
            assert [c for c in re.split(r"\s{2,}", out.splitlines()[0].strip())] == want, out
        svc = kubectl_ok(cluster, "get", "svc", "web").splitlines()[1].split()
        assert svc[1] == "NodePort" and re.fullmatch(r"80:3\d{4}/TCP", svc[4])
        dep = kubectl_ok(cluster, "get", "deploy", "web", "-o", "wide").splitlines()[1].split()
        assert dep[5:] == ["c", "registry.example/web:1", "app=web"]
        # a kind with no printer of its own gets the generic Name and Created At
        kubectl_ok(cluster, "apply", "-f", "-", stdin="apiVersion: rbac.authorization.k8s.io/v1\n"
                   "kind: ClusterRole\nmetadata: {name: viewer}\nrules: []\n")
        row = kubectl_ok(cluster, "get", "clusterroles", "viewer").splitlines()
        assert row[0].split() == ["NAME", "CREATED", "AT"]
        assert re.fullmatch(r"viewer\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", row[1])
        ds = kubectl_ok(cluster, "get", "ds", "agent").splitlines()[1].split()
        assert ds[:7] == ["agent", "0", "0", "0", "0", "0", "gpu=yes"]
        # get -w: a Table, then one row per change, headers once
        proc = subprocess.Popen([str(real_kubectl()), "--kubeconfig", str(cluster.kubeconfig),
                                 "get", "namespaces", "-w", "--output-watch-events"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "HOME": str(cluster.root)})
        time.sleep(1.5)
        kubectl_ok(cluster, "create", "namespace", "watched")
        time.sleep(1.5)
        proc.terminate()
        lines = proc.communicate(timeout=10)[0].splitlines()
        assert lines[0].split() == ["EVENT", "NAME", "STATUS", "AGE"], lines
        assert any(ln.split()[:3] == ["ADDED", "watched", "Active"] for ln in lines[1:]), lines
        assert sum(ln.startswith("EVENT") for ln in lines) == 1
        # -o name, custom-columns and jsonpath work on the same answers
        assert kubectl_ok(cluster, "get", "deploy", "-o", "name") == "deployment.apps/web\n"
        assert kubectl_ok(cluster, "get", "nodes", "-o",
                          r"custom-columns=NAME:.metadata.name,GPU:.status.allocatable.nvidia\.com/gpu"
                          ).splitlines()[1].split() == ["gpu-01", "2"]

    def test_watch_wait_and_too_old_versions(self, cluster: Cluster) -> None:
        cluster.add_node("gpu-02", ready=False)
        node = cluster.client.get("/api/v1/nodes/gpu-02")

        def ready_later() -> None:
            time.sleep(2)
            node["status"]["conditions"][0]["status"] = "True"
            cluster.client.request("PUT", "/api/v1/nodes/gpu-02/status", node)

        import threading

        t = threading.Thread(target=ready_later)
        t0 = time.monotonic()
        t.start()
        r = cluster.kubectl("wait", "--for=condition=Ready", "node/gpu-02", "--timeout=20s")
        t.join()
        assert r.returncode == 0, r.stderr
        assert r.stdout == "node/gpu-02 condition met\n"
        assert time.monotonic() - t0 >= 2  # it waited on the watch, not on a first GET
        # a watch stream: newline-delimited events, the initial ADDED, a BOOKMARK on request
        rv = cluster.client.get("/api/v1/nodes")["metadata"]["resourceVersion"]
        raw = cluster.client.request(
            "GET", "/api/v1/nodes?watch=true&timeoutSeconds=1&allowWatchBookmarks=true"
                   "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan", raw=True)
        events = [json.loads(line) for line in raw.decode().splitlines()]
        assert [e["type"] for e in events][:2] == ["ADDED", "BOOKMARK"]
        assert events[1]["object"]["metadata"]["annotations"] == {
            "k8s.io/initial-events-end": "true"}
        assert int(events[1]["object"]["metadata"]["resourceVersion"]) >= int(rv)
        # from a resourceVersion: only what changed after it, in order
        rv = cluster.client.get("/api/v1/namespaces")["metadata"]["resourceVersion"]
        kubectl_ok(cluster, "create", "namespace", "later")
        raw = cluster.client.request(
            "GET", f"/api/v1/namespaces?watch=true&timeoutSeconds=1&resourceVersion={rv}",
            raw=True)
        events = [json.loads(line) for line in raw.decode().splitlines()]
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
            ("ADDED", "later")]
        # a deletion reaches a waiting kubectl
        kubectl_ok(cluster, "create", "namespace", "gone")
        threading.Timer(1, lambda: cluster.client.request(
            "DELETE", "/api/v1/namespaces/gone")).start()
        r = cluster.kubectl("wait", "--for=delete", "namespace/gone", "--timeout=20s")
        assert r.returncode == 0 and r.stdout == "namespace/gone condition met\n", r.stderr

    def test_patch_types_label_annotate_dry_run(self, cluster: Cluster) -> None:
        kubectl_ok(cluster, "apply", "-f", "-", stdin=DEPLOY)
        kubectl_ok(cluster, "label", "deploy", "web", "tier=front")
        kubectl_ok(cluster, "annotate", "deploy", "web", "note=hi")
        d = json.loads(kubectl_ok(cluster, "get", "deploy", "web", "-o", "json",
                                  "--show-managed-fields"))
        owned = {e["manager"]: e["fieldsV1"] for e in d["metadata"]["managedFields"]}
        assert "f:tier" in owned["kubectl-label"]["f:metadata"]["f:labels"]
        # strategic merge: the container list merges by name
        kubectl_ok(cluster, "patch", "deploy", "web", "-p",
                   '{"spec":{"template":{"spec":{"containers":[{"name":"c","image":"w:2"}]}}}}')
        kubectl_ok(cluster, "patch", "deploy", "web", "--type=merge", "-p",
                   '{"metadata":{"labels":{"tier":null}}}')
        kubectl_ok(cluster, "patch", "deploy", "web", "--type=json", "-p",
                   '[{"op":"replace","path":"/spec/replicas","value":3}]')
        d = json.loads(kubectl_ok(cluster, "get", "deploy", "web", "-o", "json",
                                  "--show-managed-fields"))
        assert d["spec"]["replicas"] == 3
        assert d["spec"]["template"]["spec"]["containers"] == [{"name": "c", "image": "w:2"}]
        assert "tier" not in d["metadata"].get("labels", {})
        assert d["metadata"]["annotations"]["note"] == "hi"
        managers = {e["manager"] for e in d["metadata"]["managedFields"]}
        # the merge patch took away the one field kubectl-label owned: its entry is gone
        assert {"kubectl-client-side-apply", "kubectl-annotate", "kubectl-patch"} <= managers
        assert "kubectl-label" not in managers
        r = cluster.kubectl("patch", "deploy", "web", "--type=json", "-p",
                            '[{"op":"remove","path":"/spec/nothing"}]')
        assert r.returncode == 1 and r.stderr.startswith(
            "The request is invalid: the server rejected our request due to an error in our "
            'request: remove operation does not apply: doc is missing path: "/spec/nothing"')
        assert kubectl_ok(cluster, "create", "namespace", "ghost", "--dry-run=server") == \
            "namespace/ghost created (server dry run)\n"
        r = cluster.kubectl("get", "namespace", "ghost")
        assert r.stderr.strip() == 'Error from server (NotFound): namespaces "ghost" not found'

    def test_server_side_apply_managers_conflict_and_force(self, cluster: Cluster) -> None:
        cm = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg, namespace: default}\n"
        assert kubectl_ok(cluster, "apply", "--server-side", "--field-manager=alice", "-f", "-",
                          stdin=cm + "data: {color: red, size: big}\n") == \
            "configmap/cfg serverside-applied\n"
        r = cluster.kubectl("apply", "--server-side", "--field-manager=bob", "-f", "-",
                            stdin=cm + "data: {color: blue}\n")
        assert r.returncode == 1
        assert r.stderr.startswith('error: Apply failed with 1 conflict: conflict with "alice": '
                                   ".data.color\nPlease review the fields above--they currently "
                                   "have other managers."), r.stderr
        # the same value is no conflict: bob co-owns .data.size
        kubectl_ok(cluster, "apply", "--server-side", "--field-manager=bob", "-f", "-",
                   stdin=cm + "data: {size: big}\n")
        kubectl_ok(cluster, "apply", "--server-side", "--field-manager=bob", "--force-conflicts",
                   "-f", "-", stdin=cm + "data: {color: blue, size: big}\n")
        obj = json.loads(kubectl_ok(cluster, "get", "cm", "cfg", "-o", "json",
                                    "--show-managed-fields"))
        assert obj["data"] == {"color": "blue", "size": "big"}
        owned = {e["manager"]: e["fieldsV1"] for e in obj["metadata"]["managedFields"]}
        assert "f:color" in owned["bob"]["f:data"]
        assert "f:color" not in owned["alice"]["f:data"]
        # alice stops applying size: bob still owns it, so it stays
        kubectl_ok(cluster, "apply", "--server-side", "--field-manager=alice", "-f", "-",
                   stdin=cm)
        assert json.loads(kubectl_ok(cluster, "get", "cm", "cfg", "-o", "json"))["data"] == {
            "color": "blue", "size": "big"}

    def test_server_side_apply_drops_a_list_item_it_no_longer_applies(self,
                                                                       cluster: Cluster) -> None:
        """A redeploy without its volume (storage.enabled=false) removes the volume and its
        mount whole, as the real server does; the stand-in once removed the item's key field
        first and then could not find the item, leaving {"persistentVolumeClaim": {}}."""
        pvc = ("      volumes: [{name: shared, persistentVolumeClaim: {claimName: share}}]\n")
        mount = 'image: "registry.example/web:1"'
        with_volume = DEPLOY.replace(mount, mount + ", volumeMounts: [{name: shared, "
                                     "mountPath: /shared}]") + pvc
        for manifest in (with_volume, DEPLOY):
            kubectl_ok(cluster, "apply", "--server-side", "--field-manager=gpuk8s", "-f", "-",
                       stdin=manifest)
        spec = json.loads(kubectl_ok(cluster, "get", "deploy", "web", "-o", "json"))[
            "spec"]["template"]["spec"]
        assert "volumes" not in spec, spec
        assert "volumeMounts" not in spec["containers"][0], spec["containers"][0]
        kubectl_ok(cluster, "delete", "deploy", "web")

    def test_unknown_fields_refused_as_the_real_server_does(self, cluster: Cluster) -> None:
        bad = DEPLOY.replace("replicas: 1", "replicaz: 1")
        r = cluster.kubectl("apply", "-f", "-", stdin=bad)
        assert r.returncode == 1
        assert r.stderr.strip() == (
            'Error from server (BadRequest): error when creating "STDIN": Deployment in version '
            '"v1" cannot be handled as a Deployment: strict decoding error: unknown field '
            '"spec.replicaz"')
        r = cluster.kubectl("apply", "--server-side", "-f", "-", stdin=bad)
        assert r.returncode == 1
        assert r.stderr.strip() == (
            "Error from server: failed to create typed patch object (default/web; apps/v1, "
            "Kind=Deployment): .spec.replicaz: field not declared in schema")
        # --validate=false (fieldValidation=Ignore) drops the field, as the real server does
        r = cluster.kubectl("apply", "--validate=false", "-f", "-", stdin=bad)
        assert r.returncode == 0, r.stderr
        spec = json.loads(kubectl_ok(cluster, "get", "deploy", "web", "-o", "json"))["spec"]
        assert "replicaz" not in spec and spec["replicas"] == 1  # defaulted, not kept

    def test_status_bodies_and_reviews(self, cluster: Cluster, tmp_path: Path) -> None:
        r = cluster.kubectl("create", "configmap", "Bad_Name")
        assert r.returncode == 1
        assert 'ConfigMap "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name": a ' \
            "lowercase RFC 1123 subdomain" in r.stderr
        kubectl_ok(cluster, "create", "namespace", "twice")
        r = cluster.kubectl("create", "namespace", "twice")
        assert r.stderr.strip() == \
            'Error from server (AlreadyExists): namespaces "twice" already exists'
        cm = json.loads(kubectl_ok(cluster, "create", "configmap", "c", "-o", "json"))
        kubectl_ok(cluster, "label", "configmap", "c", "x=y")
        r = cluster.kubectl("replace", "-f", "-", stdin=json.dumps(cm))
        assert r.returncode == 1
        assert r.stderr.strip() == (
            'Error from server (Conflict): error when replacing "STDIN": Operation cannot be '
            'fulfilled on configmaps "c": the object has been modified; please apply your '
            "changes to the latest version and try again")
        assert kubectl_ok(cluster, "auth", "can-i", "create", "pods") == "yes\n"
        assert "kubernetes-admin" in kubectl_ok(cluster, "auth", "whoami")
        # a user with no rights: Forbidden with the real text, can-i says no
        pk = cluster.root / "pki"
        pki.issue(str(tmp_path / "jane.crt"), str(tmp_path / "jane.key"), str(pk / "ca.crt"),
                  str(pk / "ca.key"), "jane", orgs=["devs"])
        kc = tmp_path / "jane.conf"
        kc.write_text(kubeconfig.build(cluster.server, cluster.ca_pem, "jane",
                                       cert_pem=(tmp_path / "jane.crt").read_text(),
                                       key_pem=(tmp_path / "jane.key").read_text()))
        r = cluster.kubectl("--kubeconfig", str(kc), "get", "nodes")
        assert r.stderr.strip() == (
            'Error from server (Forbidden): nodes is forbidden: User "jane" cannot list '
            'resource "nodes" in API group "" at the cluster scope')
        r = cluster.kubectl("--kubeconfig", str(kc), "auth", "can-i", "delete", "nodes")
        assert r.returncode == 1 and r.stdout == "no\n"


def test_real_kubectl_exec_over_the_websocket(cluster: Cluster, tmp_path: Path) -> None:
    """`kubectl exec POD -- CMD` (the real kubectl's websocket remote command): the API server
    stand-in asks the pod's kubelet (here a fake on 127.0.0.1 that answers what the kubelet
    stand-in answers after `ctr task exec`) and streams stdout, stderr and the exit code."""
    import http.server
    import ssl
    import threading

    calls: list[str] = []

    class FakeKubelet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_GET(self) -> None:
            calls.append(self.path)
            argv = [v for k, v in (p.split("=", 1) for p in self.path.split("?")[1].split("&"))]
            code = 3 if "fail" in argv else 0
            body = json.dumps({"stdout": base64.b64encode(b"hello from c\n").decode(),
                               "stderr": base64.b64encode(b"a warning\n").decode(),
                               "exitCode": code}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    pki.gen_ca(str(tmp_path / "k.crt"), str(tmp_path / "k.key"), "fake-kubelet")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(tmp_path / "k.crt"), str(tmp_path / "k.key"))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeKubelet)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        cluster.add_node("gpu-01")
        node = cluster.client.get("/api/v1/nodes/gpu-01")
        node["status"]["addresses"] = [{"type": "InternalIP", "address": "127.0.0.1"}]
        node["status"]["daemonEndpoints"] = {"kubeletEndpoint": {"Port": srv.server_port}}
        cluster.client.request("PUT", "/api/v1/nodes/gpu-01/status", node)
        cluster.client.request("POST", "/api/v1/namespaces/default/pods", {
            "metadata": {"name": "p"}, "spec": {"nodeName": "gpu-01", "containers": [
                {"name": "c", "image": "x"}]}})
        pod = cluster.client.get("/api/v1/namespaces/default/pods/p")
        pod["status"]["phase"] = "Running"
        cluster.client.request("PUT", "/api/v1/namespaces/default/pods/p/status", pod)
        r = cluster.kubectl("exec", "p", "--", "echo", "hi")
        assert r.returncode == 0, r.stderr
        assert r.stdout == "hello from c\n" and r.stderr == "a warning\n"
        assert calls[-1] == "/exec/default/p/c?command=echo&command=hi"
        r = cluster.kubectl("exec", "p", "--", "fail")
        assert r.returncode == 3
        assert r.stderr.endswith("command terminated with exit code 3\n"), r.stderr
        r = cluster.kubectl("exec", "-it", "p", "--", "sh")
        assert r.returncode == 1 and "without stdin or a tty" in r.stderr
    finally:
        srv.shutdown()


def test_discovery_aggregated_and_legacy(cluster: Cluster) -> None:
    """What kubectl 1.36 asks first (aggregated, apidiscovery.k8s.io/v2) and the legacy
    documents; both name the eviction subresource kubectl drain looks for."""
    import http.client
    import ssl

    from k8s.client import ssl_context

    ctx = ssl_context(kubeconfig.load(str(cluster.kubeconfig)))
    assert isinstance(ctx, ssl.SSLContext)

    def get(path: str, accept: str) -> tuple[str, Any]:
        conn = http.client.HTTPSConnection("127.0.0.1", cluster.port, context=ctx, timeout=10)
        conn.request("GET", path, headers={"Accept": accept})
        resp = conn.getresponse()
        body = json.loads(resp.read())
        conn.close()
        return resp.getheader("Content-Type") or "", body

    agg = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
    ctype, core = get("/api", agg)
    assert ctype == "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    assert core["kind"] == "APIGroupDiscoveryList"
    pods = next(r for r in core["items"][0]["versions"][0]["resources"]
                if r["resource"] == "pods")
    assert {"subresource": "eviction", "verbs": ["create"], "responseKind": {
        "group": "policy", "version": "v1", "kind": "Eviction"}} in pods["subresources"]
    _, groups = get("/apis", agg)
    assert {"apps", "batch", "policy", "authorization.k8s.io"} <= {
        g["metadata"]["name"] for g in groups["items"]}
    _, legacy = get("/api/v1", "application/json")
    assert {"name": "pods/eviction", "singularName": "", "namespaced": True,
            "kind": "Eviction", "verbs": ["create"], "group": "policy",
            "version": "v1"} in legacy["resources"]
    _, index = get("/openapi/v3", "application/json")
    assert "apis/apps/v1" in index["paths"]
    _, doc = get(index["paths"]["apis/apps/v1"]["serverRelativeURL"], "application/json")
    patch = doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"]
    assert "fieldValidation" in [p["name"] for p in patch["parameters"]]


def test_a_tenant_namespace_as_gpuk8s_tenancy_makes_it(cluster: Cluster,
                                                       tmp_path: Path) -> None:
    """gpuk8s.tenancy's objects applied with the real kubectl: the user's edit role there only
    (can-i), LimitRange defaults on a pod that names no requests, and the ResourceQuota's real
    refusal text for the GPU past the user's quota, then its status."""
    from gpuk8s import tenancy

    cluster.add_node("gpu-01", gpus=2)
    defaults = {"cpu_request": "100m", "memory_request": "256Mi", "memory_limit": "8Gi"}
    for t in tenancy.tenants({"alice": {"gpu_quota": 1, "pods": 3}, "bob": {"gpu_quota": 2}},
                             {}):
        kubectl_ok(cluster, "apply", "--server-side", "-f", "-",
                   stdin=tenancy.manifest(t, ["nvidia.com/gpu"], defaults, "baseline"))
    pk = cluster.root / "pki"
    pki.issue(str(tmp_path / "alice.crt"), str(tmp_path / "alice.key"), str(pk / "ca.crt"),
              str(pk / "ca.key"), "alice")
    kc = tmp_path / "alice.conf"
    kc.write_text(kubeconfig.build(cluster.server, cluster.ca_pem, "alice",
                                   cert_pem=(tmp_path / "alice.crt").read_text(),
                                   key_pem=(tmp_path / "alice.key").read_text()))

    def alice(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return cluster.kubectl("--kubeconfig", str(kc), *args, stdin=stdin)

    answers = {(verb, where): alice("auth", "can-i", *verb.split(), *where.split()).stdout
               for verb, where in [("create pods", "-n alice"), ("create pods", "-n bob"),
                                   ("get nodes", ""), ("create rolebindings", "-n alice"),
                                   ("delete resourcequotas", "-n alice")]}
    assert answers == {("create pods", "-n alice"): "yes\n", ("create pods", "-n bob"): "no\n",
                       ("get nodes", ""): "no\n", ("create rolebindings", "-n alice"): "no\n",
                       ("delete resourcequotas", "-n alice"): "no\n"}

    def pod(name: str, gpus: int) -> str:
        limits = f", resources: {{limits: {{nvidia.com/gpu: {gpus}}}}}" if gpus else ""
        return (f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: alice}}\n"
                f"spec: {{containers: [{{name: c, image: registry.example/nb:1{limits}}}]}}\n")

    r = alice("apply", "-f", "-", stdin=pod("one", 1))
    assert r.returncode == 0, r.stderr
    r = alice("apply", "-f", "-", stdin=pod("two", 1))
    assert r.returncode == 1
    assert r.stderr.strip() == (
        'Error from server (Forbidden): error when creating "STDIN": pods "two" is forbidden: '
        "exceeded quota: gpuk8s-quota, requested: requests.nvidia.com/gpu=1, used: "
        "requests.nvidia.com/gpu=1, limited: requests.nvidia.com/gpu=1")
    r = alice("apply", "-f", "-", stdin=pod("cpu-only", 0))
    assert r.returncode == 0, r.stderr
    got = json.loads(alice("get", "pod", "cpu-only", "-n", "alice", "-o", "json").stdout)
    assert got["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "8Gi"}}
    status = wait_for(lambda: (json.loads(alice(
        "get", "resourcequota", "gpuk8s-quota", "-n", "alice", "-o", "json").stdout).get(
        "status") or {}).get("used"))
    assert status == {"pods": "2", "requests.nvidia.com/gpu": "1"}
