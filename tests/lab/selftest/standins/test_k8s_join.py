"""kubeadm join against a running API server stand-in: token and CA-pin discovery, the TLS
bootstrap, a worker joining with the printed join command, upload-certs, and a control-plane
join refused without a stable endpoint."""

from __future__ import annotations

import base64
import json
import secrets
import subprocess
import time
from pathlib import Path

from k8s import pki
from k8s.kubeadm import cluster_info_kubeconfig, create_token_secret

from tests.lab.selftest.standins.k8s_helpers import NEEDS_OPENSSL, Cluster, Node, wait_for

pytestmark = NEEDS_OPENSSL


class TestJoinDiscovery:
    """kubeadm join against a running API server: token and CA pin validation."""

    def setup_token(self, cluster: Cluster, ttl: float = 900) -> str:
        cluster.client.request("POST", "/api/v1/namespaces/kube-public/configmaps", {
            "metadata": {"name": "cluster-info", "namespace": "kube-public"},
            "data": {"kubeconfig": cluster_info_kubeconfig(cluster.server, cluster.ca_pem)}})
        tok = "abcdef.0123456789abcdef"
        create_token_secret(cluster.client, tok, ttl, "", None, None)
        return tok

    def join(self, node: Node, cluster: Cluster, token: str, ca_hash: str
             ) -> subprocess.CompletedProcess[str]:
        cfg = node.root / "_join.yaml"
        cfg.write_text(f"""apiVersion: kubeadm.k8s.io/v1beta4
kind: JoinConfiguration
discovery:
  bootstrapToken:
    apiServerEndpoint: 127.0.0.1:{cluster.port}
    token: {token}
    caCertHashes: ["{ca_hash}"]
nodeRegistration: {{name: gpu-01}}
timeouts: {{discovery: 3s, kubeletHealthCheck: 2s}}
""")
        return node.run("kubeadm", "join", "--config", str(cfg))

    def test_wrong_token(self, node: Node, cluster: Cluster) -> None:
        self.setup_token(cluster)
        r = self.join(node, cluster, "zzzzzz.0123456789abcdef", pki.ca_cert_hash(cluster.ca_pem))
        assert r.returncode == 1
        assert r.stderr.splitlines()[0] == (
            "error execution phase preflight: couldn't validate the identity of the API Server: "
            'could not find a JWS signature in the cluster-info ConfigMap for token ID "zzzzzz"')

    def test_wrong_secret_same_id(self, node: Node, cluster: Cluster) -> None:
        self.setup_token(cluster)
        time.sleep(0.5)
        r = self.join(node, cluster, "abcdef.xxxxxxxxxxxxxxxx", pki.ca_cert_hash(cluster.ca_pem))
        assert "failed to verify JWS signature of received cluster info object, can't trust " \
            "this API Server" in r.stderr

    def test_expired_token(self, node: Node, cluster: Cluster) -> None:
        tok = self.setup_token(cluster, ttl=1)
        time.sleep(2.5)
        r = self.join(node, cluster, tok, pki.ca_cert_hash(cluster.ca_pem))
        assert r.returncode == 1
        assert 'could not find a JWS signature in the cluster-info ConfigMap for token ID ' \
            '"abcdef"' in r.stderr
        secrets = cluster.client.get("/api/v1/namespaces/kube-system/secrets")["items"]
        assert not [s for s in secrets if s["metadata"]["name"] == "bootstrap-token-abcdef"]

    def test_wrong_ca_hash(self, node: Node, cluster: Cluster) -> None:
        tok = self.setup_token(cluster)
        time.sleep(0.5)
        r = self.join(node, cluster, tok, "sha256:" + "0" * 64)
        real = pki.ca_cert_hash(cluster.ca_pem)
        assert r.returncode == 1
        assert r.stderr.splitlines()[0] == (
            "error execution phase preflight: couldn't validate the identity of the API Server: "
            f'cluster CA found in cluster-info ConfigMap is invalid: none of the public keys '
            f'"{real}" are pinned')
        assert not (node.root / "etc/kubernetes/kubelet.conf").exists()

    def test_good_token_tls_bootstrap(self, node: Node, cluster: Cluster) -> None:
        tok = self.setup_token(cluster)
        cluster.client.request("POST", "/api/v1/namespaces/kube-system/configmaps", {
            "metadata": {"name": "kubelet-config", "namespace": "kube-system"},
            "data": {"kubelet": "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: "
                     "KubeletConfiguration\nfeatureGates: {ImageVolume: true}\n"}})
        time.sleep(0.5)
        r = self.join(node, cluster, tok, pki.ca_cert_hash(cluster.ca_pem))
        # the CSR was signed and the kubelet config from the cluster was written; the kubelet
        # itself cannot come up here (its kubeconfig points at the test cluster, fine) so the
        # join either succeeds or fails only at the kubelet health check
        cfg = (node.root / "var/lib/kubelet/config.yaml").read_text()
        assert "ImageVolume: true" in cfg
        kc = (node.root / "etc/kubernetes/kubelet.conf").read_text()
        assert "/var/lib/kubelet/pki/kubelet-client-current.pem" in kc
        pem = (node.root / "var/lib/kubelet/pki/kubelet-client-current.pem").read_text()
        subj = subprocess.run(["openssl", "x509", "-noout", "-subject"], input=pem,
                              capture_output=True, text=True).stdout
        assert "system:node:gpu-01" in subj and "system:nodes" in subj
        assert "This node has joined the cluster:" in r.stdout or \
            "The kubelet is not healthy" in r.stderr


def test_worker_joins_with_printed_join_command(control_plane: tuple[Node, str],
                                                tmp_path: Path) -> None:
    """init, then the one-line join command from `kubeadm token create` on a second root."""
    cp, kc = control_plane
    line = cp.run("kubeadm", "token", "create", "--ttl", "15m0s", "--print-join-command",
                  "--kubeconfig", kc).stdout.split()
    assert line[:2] == ["kubeadm", "join"]
    # one kubelet per host port: stop the control plane's kubelet (its API server keeps running,
    # like static pods do when the real kubelet stops)
    subprocess.run(["systemctl", "stop", "kubelet"], env=cp.env(), check=True)
    worker = Node(tmp_path / "worker")
    try:
        (worker.root / "etc/hostname").write_text("gpu-01\n")
        r = worker.run("kubeadm", *line[1:])
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.rstrip().endswith("Run 'kubectl get nodes' on the control-plane to see "
                                          "this node join the cluster.")
        wait_for(lambda: "gpu-01" in cp.run("kubectl", "--kubeconfig", kc, "get", "nodes"
                                            ).stdout)
        cfg = (worker.root / "var/lib/kubelet/config.yaml").read_text()
        assert "ImageVolume: true" in cfg  # feature gates from init reach the worker
        r = worker.run("kubeadm", *line[1:])
        assert "[ERROR FileAvailable--etc-kubernetes-kubelet.conf]: /etc/kubernetes/kubelet.conf" \
            " already exists" in r.stderr
    finally:
        worker.cleanup()


def test_upload_certs_encrypts_them_with_the_certificate_key(
        control_plane: tuple[Node, str]) -> None:
    """`kubeadm init phase upload-certs --upload-certs`: kubeadm-certs holds the shared CAs and
    keys, each AES-256-GCM encrypted with the certificate key (12-byte nonce first), owned by a
    bootstrap token that expires in two hours."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    cp, kc = control_plane
    key = secrets.token_hex(32)  # as gpuk8s makes it (handoffs.upload_certs)
    r = cp.run("kubeadm", "init", "phase", "upload-certs", "--upload-certs",
               "--certificate-key", key, "--kubeconfig", kc)
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith(f"[upload-certs] Using certificate key:\n{key}\n")
    sec = json.loads(cp.run("kubectl", "--kubeconfig", kc, "-n", "kube-system", "get", "secret",
                            "kubeadm-certs", "-o", "json").stdout)
    assert sorted(sec["data"]) == ["ca.crt", "ca.key", "etcd-ca.crt", "etcd-ca.key",
                                   "front-proxy-ca.crt", "front-proxy-ca.key", "sa.key",
                                   "sa.pub"]
    blob = base64.b64decode(sec["data"]["ca.key"])
    assert b"PRIVATE KEY" not in blob  # not readable without the key
    plain = AESGCM(bytes.fromhex(key)).decrypt(blob[:12], blob[12:], None)
    assert plain.decode() == (cp.root / "etc/kubernetes/pki/ca.key").read_text()
    owner = sec["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "Secret" and owner["name"].startswith("bootstrap-token-")
    bad = cp.run("kubeadm", "init", "phase", "upload-certs", "--upload-certs",
                 "--certificate-key", "nothex", "--kubeconfig", kc)
    assert bad.returncode == 1 and "error decoding certificate key" in bad.stderr


def test_control_plane_join_needs_a_stable_endpoint(control_plane: tuple[Node, str],
                                                    tmp_path: Path) -> None:
    """kubeadm refuses a second control plane for a cluster initialised without
    controlPlaneEndpoint (its first API server's address is no stable endpoint)."""
    cp, kc = control_plane
    line = cp.run("kubeadm", "token", "create", "--ttl", "15m0s", "--print-join-command",
                  "--kubeconfig", kc).stdout.split()
    key = secrets.token_hex(32)
    subprocess.run(["systemctl", "stop", "kubelet"], env=cp.env(), check=True)
    other = Node(tmp_path / "cp-02")
    try:
        (other.root / "etc/hostname").write_text("cp-02\n")
        r = other.run("kubeadm", *line[1:], "--control-plane", "--certificate-key", key,
                      "--ignore-preflight-errors=all")
        assert r.returncode == 1
        assert "unable to add a new control plane instance to a cluster that doesn't have a " \
            "stable controlPlaneEndpoint address" in r.stderr
        assert not (other.root / "etc/kubernetes/pki/ca.key").exists()
    finally:
        other.cleanup()
