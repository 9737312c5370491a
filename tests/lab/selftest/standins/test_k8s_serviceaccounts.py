"""A pod's ServiceAccount, as a program in a pod reaches the API server with it (what
kubernetes_asyncio's load_incluster_config reads): the ServiceAccount admission plugin, the
ServiceAccount and root CA publisher controllers, the endpoint reconciler's default/kubernetes
and kube-proxy's rule for it, the kubelet's projected token volume and Service variables, and
the PersistentVolume controller's pre-bound volumes. An API server stand-in with a REAL etcd on
this machine; the kubelet's part against a temp root (GPUK8S_LAB_ROOT)."""

from __future__ import annotations

import json
import os
import ssl
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from k8s import kubeconfig, proxy, realpods
from k8s.client import ApiError, Client

from tests.lab.selftest.standins.k8s_helpers import NEEDS_OPENSSL, Cluster, Obj, wait_for

pytestmark = NEEDS_OPENSSL

TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "cluster", sa_key=True)
    yield c
    c.stop()


def pod(name: str, ns: str = "default", **spec: Any) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec}}


def create(c: Cluster, obj: Obj) -> Obj:
    ns = obj["metadata"].get("namespace", "default")
    got: Obj = c.client.request("POST", f"/api/v1/namespaces/{ns}/pods", obj)
    return got


def refusal(c: Cluster, obj: Obj) -> str:
    with pytest.raises(ApiError) as exc:
        create(c, obj)
    assert exc.value.code == 403
    return str(exc.value)


def token_volume(p: Obj) -> Obj | None:
    return next((v for v in p["spec"].get("volumes") or []
                 if v["name"].startswith("kube-api-access-")), None)


def ready_namespace(c: Cluster, ns: str) -> None:
    """The controllers have made ns's default ServiceAccount and kube-root-ca.crt."""
    def there() -> bool:
        try:
            c.client.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default")
            c.client.get(f"/api/v1/namespaces/{ns}/configmaps/kube-root-ca.crt")
        except ApiError:
            return False
        return True

    wait_for(there)


class TestAdmission:
    def test_the_token_volume_and_its_mounts(self, cluster: Cluster) -> None:
        """admission.go: serviceAccountName "default", the projected volume of
        TokenVolumeSource and a read-only mount in every container (init ones too) that has
        none at the token path; a pod keeps its own mount there."""
        ready_namespace(cluster, "default")
        got = create(cluster, pod("p", initContainers=[{"name": "i", "image": "busybox"}],
                                  volumes=[{"name": "own", "emptyDir": {}}],
                                  containers=[{"name": "a", "image": "busybox"},
                                              {"name": "b", "image": "busybox", "volumeMounts": [
                                                  {"name": "own", "mountPath": TOKEN_PATH}]}]))
        spec = got["spec"]
        assert spec["serviceAccountName"] == spec["serviceAccount"] == "default"
        vol = token_volume(got)
        assert vol is not None and len(vol["name"]) == len("kube-api-access-") + 5
        assert vol["projected"] == {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt",
                           "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}
        mount = {"name": vol["name"], "readOnly": True, "mountPath": TOKEN_PATH}
        assert spec["initContainers"][0]["volumeMounts"] == [mount]
        assert spec["containers"][0]["volumeMounts"] == [mount]
        assert spec["containers"][1]["volumeMounts"] == [{"name": "own",
                                                          "mountPath": TOKEN_PATH}]
        assert [v["name"] for v in spec["volumes"]] == ["own", vol["name"]]

    def test_a_missing_service_account_is_refused(self, cluster: Cluster) -> None:
        """The real refusal (admission.NewForbidden of getServiceAccount's NotFound), through
        the real kubectl as a user sees it."""
        ready_namespace(cluster, "default")
        r = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(
            pod("x", serviceAccountName="nope")))
        assert r.returncode == 1
        assert r.stderr.strip() == (
            'Error from server (Forbidden): error when creating "STDIN": pods "x" is '
            'forbidden: error looking up service account default/nope: serviceaccount "nope" '
            "not found")
        gen = pod("", serviceAccountName="nope")
        gen["metadata"] = {"generateName": "w-", "namespace": "default"}
        assert refusal(cluster, gen) == (
            "pods is forbidden: error looking up service account default/nope: "
            'serviceaccount "nope" not found')

    def test_automount_false_of_the_pod_or_the_service_account(self, cluster: Cluster) -> None:
        """shouldAutomount: the pod's automountServiceAccountToken wins, then the
        ServiceAccount's; imagePullSecrets come from the ServiceAccount when the pod has
        none."""
        ready_namespace(cluster, "default")
        c = cluster.client
        c.request("POST", "/api/v1/namespaces/default/serviceaccounts", {
            "metadata": {"name": "quiet"}, "automountServiceAccountToken": False,
            "imagePullSecrets": [{"name": "regcred"}]})
        off = create(cluster, pod("off", automountServiceAccountToken=False))
        assert token_volume(off) is None and "volumeMounts" not in off["spec"]["containers"][0]
        quiet = create(cluster, pod("quiet", serviceAccountName="quiet"))
        assert token_volume(quiet) is None
        assert quiet["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
        on = create(cluster, pod("on", serviceAccountName="quiet",
                                 automountServiceAccountToken=True,
                                 imagePullSecrets=[{"name": "mine"}]))
        assert token_volume(on) is not None
        assert on["spec"]["imagePullSecrets"] == [{"name": "mine"}]

    def test_a_pod_right_after_its_namespace_waits_for_default(self, cluster: Cluster) -> None:
        """getServiceAccount looks "default" up again for a while (the ServiceAccount
        controller makes it a moment after the namespace): a pod created at once is
        admitted."""
        c = cluster.client
        for i in range(3):
            ns = f"fresh-{i}"
            c.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
            got = create(cluster, pod("p", ns))
            assert token_volume(got) is not None

    def test_mirror_pods(self, cluster: Cluster) -> None:
        """A static pod's mirror pod is left alone, and may not name a ServiceAccount
        (admission.go Validate)."""
        mirror = pod("etcd-cp-01", "kube-system")
        mirror["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "x"}
        got = create(cluster, mirror)
        assert "serviceAccountName" not in got["spec"] and token_volume(got) is None
        named = json.loads(json.dumps(mirror))
        named["metadata"]["name"] = "other-cp-01"
        named["spec"]["serviceAccountName"] = "default"
        assert refusal(cluster, named) == ('pods "other-cp-01" is forbidden: a mirror pod may '
                                           "not reference service accounts")


class TestControllers:
    def test_default_service_accounts_and_root_ca(self, cluster: Cluster) -> None:
        """The ServiceAccount controller's "default" and the root CA publisher's
        kube-root-ca.crt (ca.crt = the cluster CA, its description annotation) in every
        namespace, made again when deleted, their data put back when changed."""
        c = cluster.client
        c.request("POST", "/api/v1/namespaces", {"metadata": {"name": "jhub"}})
        for ns in (*NAMESPACES, "jhub"):
            ready_namespace(cluster, ns)
            cm = c.get(f"/api/v1/namespaces/{ns}/configmaps/kube-root-ca.crt")
            assert cm["data"] == {"ca.crt": cluster.ca_pem}
            assert cm["metadata"]["annotations"]["kubernetes.io/description"].startswith(
                "Contains a CA bundle that can be used to verify the kube-apiserver when using "
                "internal endpoints such as the internal service IP or kubernetes.default.svc.")
        sa_uid = c.get("/api/v1/namespaces/jhub/serviceaccounts/default")["metadata"]["uid"]
        c.request("DELETE", "/api/v1/namespaces/jhub/serviceaccounts/default")
        assert wait_for(lambda: _get(c, "/api/v1/namespaces/jhub/serviceaccounts/default"
                                     ).get("metadata", {}).get("uid") not in (None, sa_uid))
        cm = c.get("/api/v1/namespaces/jhub/configmaps/kube-root-ca.crt")
        cm["data"] = {"ca.crt": "tampered"}
        c.request("PUT", "/api/v1/namespaces/jhub/configmaps/kube-root-ca.crt", cm)
        assert wait_for(lambda: _get(c, "/api/v1/namespaces/jhub/configmaps/kube-root-ca.crt"
                                     ).get("data") == {"ca.crt": cluster.ca_pem})
        c.request("DELETE", "/api/v1/namespaces/jhub/configmaps/kube-root-ca.crt")
        assert wait_for(lambda: _get(c, "/api/v1/namespaces/jhub/configmaps/kube-root-ca.crt"))

    def test_the_kubernetes_service_and_its_endpoints(self, cluster: Cluster) -> None:
        """The endpoint reconciler's Endpoints default/kubernetes (this API server's
        advertise address and secure port, named https), and kube-proxy's DNAT of the
        Service's ClusterIP to it: the rule a pod's https://10.96.0.1:443 goes through."""
        c = cluster.client
        svc = c.get("/api/v1/namespaces/default/services/kubernetes")
        assert svc["spec"]["clusterIP"] == "10.96.0.1" and "selector" not in svc["spec"]
        ep = wait_for(lambda: _get(c, "/api/v1/namespaces/default/endpoints/kubernetes"))
        assert ep["subsets"] == [{"addresses": [{"ip": "127.0.0.1"}], "ports": [
            {"name": "https", "port": cluster.port, "protocol": "TCP"}]}]
        assert ep["metadata"]["labels"] == {"endpointslice.kubernetes.io/skip-mirror": "true"}
        text = proxy.rules([svc, {**ep, "kind": "Endpoints"}], [])
        assert ("-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -m comment "
                '--comment "default/kubernetes:https cluster IP" -j DNAT --to-destination '
                f"127.0.0.1:{cluster.port}") in text
        assert "10.96.0.1" not in proxy.rules([svc], [])   # no Endpoints: no rule


def _get(c: Client, path: str) -> Obj:
    try:
        got: Obj = c.get(path)
    except ApiError:
        return {}
    return got


class TestKubelet:
    """The kubelet's part (realpods.Resolver/prepare) against the API server: the projected
    volume's files as the pod sees them, the Services' variables, the token's renewal."""

    @pytest.fixture
    def node(self, cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
        root = tmp_path / "node"
        root.mkdir()
        monkeypatch.setenv("GPUK8S_LAB_ROOT", str(root))
        cluster.add_node("gpu-01")
        ready_namespace(cluster, "default")
        return root

    def start(self, cluster: Cluster, node: Path, obj: Obj) -> tuple[Obj, Obj, Path]:
        """The pod created and bound to gpu-01, prepared by the kubelet: (pod, the runner's
        spec, the token volume's folder on the node)."""
        obj["spec"]["nodeName"] = "gpu-01"
        p = create(cluster, obj)
        spec = realpods.prepare(cluster.client, p, "10.88.0.12", [], False,
                                "/var/log/pods/x", {})
        vol = token_volume(p)
        folder = node / f"var/lib/kubelet/pods/{p['metadata']['uid']}/volumes/" \
            f"kubernetes.io~projected/{vol['name'] if vol else ''}"
        return p, spec, folder

    def test_the_projected_token_volume(self, cluster: Cluster, node: Path) -> None:
        """The files kubernetes_asyncio's load_incluster_config reads: a token that
        authenticates as the pod's ServiceAccount (bound to the pod), the CA that verifies the
        API server's certificate, the namespace; 0644 files by default, mounted read-only at
        the token path."""
        p, spec, folder = self.start(cluster, node, pod("hub"))
        (mount,) = spec["containers"][0]["mounts"]
        assert mount == {"src": str(folder), "dst": TOKEN_PATH, "ro": True}
        assert sorted(os.listdir(folder)) == ["ca.crt", "namespace", "token"]
        assert (folder / "namespace").read_text() == "default"
        assert (folder / "ca.crt").read_text() == cluster.ca_pem
        for name in ("ca.crt", "namespace", "token"):
            assert stat.S_IMODE((folder / name).stat().st_mode) == 0o644, name
        token = (folder / "token").read_text()
        me = Client(kubeconfig.Creds(cluster.server, (folder / "ca.crt").read_text(),
                                     token=token))
        review = me.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                            {"apiVersion": "authentication.k8s.io/v1",
                             "kind": "SelfSubjectReview"})
        user = review["status"]["userInfo"]
        assert user["username"] == "system:serviceaccount:default:default"
        assert user["extra"]["authentication.kubernetes.io/pod-name"] == ["hub"]
        assert user["extra"]["authentication.kubernetes.io/pod-uid"] == [p["metadata"]["uid"]]
        ctx = ssl.create_default_context(cafile=str(folder / "ca.crt"))
        assert ctx.get_ca_certs()  # the CA file is one a TLS client loads

    def test_modes_with_fs_group_and_run_as_user(self, cluster: Cluster, node: Path) -> None:
        """projected.go: a token is 0600 when the pod has an fsGroup or one runAsUser (then
        owned by that user); with an fsGroup every file and folder is that group's and
        group-readable (volume_linux.go: the token 0640, the folder setgid)."""
        _, _, folder = self.start(cluster, node, pod(
            "grouped", securityContext={"runAsUser": 1000, "fsGroup": 2000}))
        st = (folder / "token").stat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, 1000, 2000)
        st = (folder / "ca.crt").stat()
        assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o644, 2000)
        assert folder.stat().st_mode & stat.S_ISGID and folder.stat().st_gid == 2000
        _, _, folder = self.start(cluster, node, pod(
            "user-only", securityContext={"runAsUser": 1000}))
        st = (folder / "token").stat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, 1000)
        assert stat.S_IMODE((folder / "namespace").stat().st_mode) == 0o644

    def test_service_variables(self, cluster: Cluster, node: Path) -> None:
        """getServiceEnvVarMap: the kubernetes Service's variables always, the pod's own
        namespace's Services' unless enableServiceLinks is false (not headless ones); the
        pod's explicit env wins (what z2jh's hub reads: HUB_SERVICE_PORT,
        PROXY_API_SERVICE_PORT)."""
        c = cluster.client
        for name, ports, extra in (
                ("hub", [{"port": 8081, "name": "hub"}], {}),
                ("proxy-api", [{"port": 8001, "name": "http-api"}], {}),
                ("peers", [{"port": 1}], {"clusterIP": "None"})):
            c.request("POST", "/api/v1/namespaces/default/services", {
                "metadata": {"name": name},
                "spec": {"selector": {"app": name}, "ports": ports, **extra}})
        hub_ip = c.get("/api/v1/namespaces/default/services/hub")["spec"]["clusterIP"]
        _, spec, _ = self.start(cluster, node, pod("linked", containers=[{
            "name": "c", "image": "busybox",
            "env": [{"name": "HUB_SERVICE_HOST", "value": "mine"}]}]))
        env = spec["containers"][0]["env"]
        assert env["HUB_SERVICE_HOST"] == "mine"
        assert env["HUB_SERVICE_PORT"] == env["HUB_SERVICE_PORT_HUB"] == "8081"
        assert env["HUB_PORT"] == env["HUB_PORT_8081_TCP"] == f"tcp://{hub_ip}:8081"
        assert env["HUB_PORT_8081_TCP_ADDR"] == hub_ip
        assert env["PROXY_API_SERVICE_PORT"] == env["PROXY_API_SERVICE_PORT_HTTP_API"] == "8001"
        assert env["KUBERNETES_SERVICE_HOST"] == "10.96.0.1"
        assert env["KUBERNETES_SERVICE_PORT"] == env["KUBERNETES_SERVICE_PORT_HTTPS"] == "443"
        assert env["KUBERNETES_PORT_443_TCP"] == "tcp://10.96.0.1:443"
        assert not any(k.startswith("PEERS_") for k in env)
        _, spec, _ = self.start(cluster, node, pod("unlinked", enableServiceLinks=False))
        env = spec["containers"][0]["env"]
        assert {k for k in env if not k.startswith("KUBERNETES_")} == set()
        assert env["KUBERNETES_SERVICE_HOST"] == "10.96.0.1"

    def test_the_token_is_renewed(self, cluster: Cluster, node: Path) -> None:
        """The token manager writes a new token once the old one is past 80% of its 3607 s
        (the file's age), not before."""
        p, _, folder = self.start(cluster, node, pod("long"))
        old = (folder / "token").read_text()
        assert realpods.refresh_tokens(cluster.client, p) == []
        time.sleep(1.1)  # a new token's iat differs
        assert realpods.refresh_tokens(cluster.client, p, now=time.time() + 0.81 * 3607) == [
            f"/var/lib/kubelet/pods/{p['metadata']['uid']}/volumes/kubernetes.io~projected/"
            f"{folder.name}/token"]
        assert (folder / "token").read_text() != old
        assert stat.S_IMODE((folder / "token").stat().st_mode) == 0o644

    def test_a_missing_root_ca_fails_the_mount(self, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
        """No kube-root-ca.crt (the publisher has not run): the kubelet's FailedMount text,
        nothing written; retried at the next sync."""
        monkeypatch.setenv("GPUK8S_LAB_ROOT", str(tmp_path))

        class Api:
            def get(self, path: str) -> Obj:
                raise ApiError(404, {"message": "not found"})

            def request(self, method: str, path: str, body: Obj | None = None) -> Obj:
                return {"status": {"token": "t"}}

        p = {"metadata": {"name": "p", "namespace": "ml", "uid": "u"}, "spec": {}}
        source = {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt",
                           "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}
        with pytest.raises(realpods.VolumeError) as exc:
            realpods.Resolver(Api(), p).volume(  # type: ignore[arg-type]
                {"name": "kube-api-access-abcde", "projected": source}, "/var/lib/kubelet/u")
        assert str(exc.value) == ('MountVolume.SetUp failed for volume "kube-api-access-abcde" '
                                  ': configmap "kube-root-ca.crt" not found')
        assert not (tmp_path / "var/lib/kubelet/u").exists()


class TestPersistentVolumes:
    def test_a_claim_binds_to_the_volume_pre_bound_to_it(self, cluster: Cluster) -> None:
        """pv_controller.go syncUnboundClaim: a claim without volumeName (KubeSpawner's
        claim-<user>) binds to the Available volume whose claimRef names it, when its access
        modes and capacity fit: the claim's volumeName and annotations, the volume's claimRef
        uid, both Bound. A pre-bound volume too small, or none, leaves the claim Pending."""
        c = cluster.client
        c.request("POST", "/api/v1/namespaces", {"metadata": {"name": "jhub"}})
        for name, size in (("home-alice", "10Gi"), ("home-bob", "1Gi")):
            c.request("POST", "/api/v1/persistentvolumes", {
                "metadata": {"name": name},
                "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteMany"],
                         "nfs": {"server": "10.88.0.1", "path": f"/homes/{name}"},
                         "claimRef": {"namespace": "jhub", "name": f"claim-{name[5:]}"}}})
        for user in ("alice", "bob", "carol"):
            c.request("POST", "/api/v1/namespaces/jhub/persistentvolumeclaims", {
                "metadata": {"name": f"claim-{user}"},
                "spec": {"accessModes": ["ReadWriteMany"],
                         "resources": {"requests": {"storage": "5Gi"}}}})
        claim = wait_for(lambda: (lambda o: o if o.get("status", {}).get("phase") == "Bound"
                                  else None)(c.get("/api/v1/namespaces/jhub/"
                                                   "persistentvolumeclaims/claim-alice")))
        assert claim["spec"]["volumeName"] == "home-alice"
        assert claim["status"] == {"phase": "Bound", "accessModes": ["ReadWriteMany"],
                                   "capacity": {"storage": "10Gi"}}
        assert claim["metadata"]["annotations"] == {
            "pv.kubernetes.io/bind-completed": "yes", "pv.kubernetes.io/bound-by-controller":
            "yes"}
        pv = c.get("/api/v1/persistentvolumes/home-alice")
        assert pv["status"]["phase"] == "Bound"
        ref = pv["spec"]["claimRef"]
        assert (ref["kind"], ref["namespace"], ref["name"], ref["uid"]) == (
            "PersistentVolumeClaim", "jhub", "claim-alice", claim["metadata"]["uid"])
        assert "pv.kubernetes.io/bound-by-controller" not in (
            pv["metadata"].get("annotations") or {})   # the user pre-bound it
        time.sleep(1)  # several controller passes
        for user in ("bob", "carol"):
            got = c.get(f"/api/v1/namespaces/jhub/persistentvolumeclaims/claim-{user}")
            assert got["status"] == {"phase": "Pending"} and not got["spec"].get("volumeName")
        assert c.get("/api/v1/persistentvolumes/home-bob")["status"]["phase"] == "Available"


def test_an_admin_impersonates_a_service_account(cluster: Cluster) -> None:
    """kubectl auth can-i --as system:serviceaccount:NS:NAME: the answer is the
    ServiceAccount's (its groups added), not the admin's (impersonation.go)."""
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": {"verb": "create", "resource": "pods",
                                              "namespace": "default"}}}
    path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
    assert cluster.client.request("POST", path, review)["status"]["allowed"] is True
    plain = cluster.client._headers
    cluster.client._headers = lambda: {  # type: ignore[method-assign]
        **plain(), "Impersonate-User": "system:serviceaccount:default:default"}
    try:
        got = cluster.client.request("POST", path, review)
    finally:
        cluster.client._headers = plain  # type: ignore[method-assign]
    assert got["status"]["allowed"] is False, got
