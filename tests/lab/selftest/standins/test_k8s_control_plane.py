"""kubeadm init end to end on one temp root, with the kubelet stand-in as a child process and the
REAL etcd: init's output and files, feature gates through init phases, upgrade apply's version
policy, the pod network, GPUs, reset, and the kubelet's refusals."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import re
import subprocess
import time
from pathlib import Path

import yaml
from k8s import pki

from tests.lab.repos import real_etcd
from tests.lab.selftest.standins.k8s_helpers import FLANNEL, INIT_CFG, NEEDS_OPENSSL, Node, wait_for

pytestmark = NEEDS_OPENSSL


NVIDIA_RT = """        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]
          runtime_type = 'io.containerd.runc.v2'
          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]
            BinaryName = '/usr/bin/nvidia-container-runtime'
            SystemdCgroup = true
"""


DEVICE_PLUGIN = """apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: nvidia}
handler: nvidia
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: nvidia-device-plugin-daemonset, namespace: kube-system}
spec:
  selector: {matchLabels: {name: nvidia-device-plugin-ds}}
  template:
    metadata: {labels: {name: nvidia-device-plugin-ds}}
    spec:
      runtimeClassName: nvidia
      tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
      containers:
      - {name: nvidia-device-plugin-ctr, image: "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"}
"""


SMOKE = """apiVersion: v1
kind: Pod
metadata: {name: gpu-smoke, namespace: default}
spec:
  restartPolicy: Never
  runtimeClassName: nvidia
  containers:
  - name: smi
    image: nvcr.io/nvidia/cuda:13.0.0-base-ubuntu24.04
    command: [nvidia-smi, -L]
    resources: {limits: {nvidia.com/gpu: 1}}
"""


class TestControlPlaneEndToEnd:
    def test_init_output_and_files(self, control_plane: tuple[Node, str]) -> None:
        node, kc = control_plane
        man = (node.root / "etc/kubernetes/manifests/kube-apiserver.yaml").read_text()
        assert "--feature-gates=DRAPartitionableDevices=true" in man
        assert "--service-cluster-ip-range=10.96.0.0/12" in man
        for f in ("admin.conf", "super-admin.conf", "kubelet.conf", "controller-manager.conf",
                  "scheduler.conf"):
            assert "client-certificate-data" in (node.root / "etc/kubernetes" / f).read_text()
        k = lambda *a: node.run("kubectl", "--kubeconfig", kc, *a)  # noqa: E731
        line = node.run("kubeadm", "token", "create", "--ttl", "15m0s", "--print-join-command",
                        "--kubeconfig", kc).stdout
        ca = (node.root / "etc/kubernetes/pki/ca.crt").read_text()
        assert line.startswith("kubeadm join 127.0.0.1:")
        assert line.endswith(f"--discovery-token-ca-cert-hash {pki.ca_cert_hash(ca)} \n")

        assert re.search(r"--token [a-z0-9]{6}\.[a-z0-9]{16} ", line)
        cm = json.loads(k("get", "configmap", "kubeadm-config", "-n", "kube-system", "-o",
                          "json").stdout)
        assert "ClusterConfiguration" in cm["data"]
        assert 'kubernetes_feature_enabled{name="DRAPartitionableDevices",stage="BETA"} 1' in \
            k("get", "--raw", "/metrics").stdout
        configz = json.loads(k("get", "--raw", "/api/v1/nodes/cp-01/proxy/configz").stdout)
        assert configz["kubeletconfig"]["featureGates"] == {"ImageVolume": True}
        # second init refuses: ports and files of the running control plane
        r = node.run("kubeadm", "init", "--config", str(node.root / "_kubeadm.yaml"))
        assert "[ERROR FileAvailable--etc-kubernetes-manifests-kube-apiserver.yaml]" in r.stderr
        assert "[ERROR Port-10250]: Port 10250 is in use" in r.stderr

    def test_certs_renew_all(self, control_plane: tuple[Node, str]) -> None:
        """`kubeadm certs renew all`: every leaf and kubeconfig client certificate again,
        new keys, the old subjects and SANs, from the same CAs; admin.conf keeps working."""
        node, kc = control_plane
        pki_dir = node.root / "etc/kubernetes/pki"
        before = {p: p.read_text() for p in [*pki_dir.glob("*.crt"), *pki_dir.glob("etcd/*.crt")]}
        admin = (node.root / "etc/kubernetes/admin.conf").read_text()
        r = node.run("kubeadm", "certs", "renew", "all")
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert "certificate for serving the Kubernetes API renewed" in lines
        assert lines[-1].startswith("Done renewing certificates. You must restart the "
                                    "kube-apiserver")
        assert sum(line.endswith(" renewed") for line in lines) == 11
        for path, old in before.items():
            new = path.read_text()
            if path.name in ("ca.crt", "front-proxy-ca.crt"):
                assert new == old, path  # CAs are not renewed
                continue
            assert new != old, path
            assert pki.attributes(new) == pki.attributes(old), path
        assert (node.root / "etc/kubernetes/admin.conf").read_text() != admin
        r = node.run("kubectl", "--kubeconfig", kc, "get", "nodes", "-o", "name")
        assert r.returncode == 0 and "node/cp-01" in r.stdout, r.stderr
        r = node.run("kubeadm", "certs", "check-expiration")
        assert r.returncode == 1 and 'unknown command "check-expiration"' in r.stderr

    def test_certs_renew_with_a_config_takes_its_validity(
            self, control_plane: tuple[Node, str]) -> None:
        """`kubeadm certs renew all --config F`: F's certificateValidityPeriod (v1beta4), not
        the ConfigMap's, and none of the ConfigMap lines; without one, a year."""
        node, _ = control_plane
        config = node.root / "_renew.yaml"
        config.write_text("apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\n"
                          "certificateValidityPeriod: 240h\n")
        api = node.root / "etc/kubernetes/pki/apiserver.crt"

        def days_left() -> float:
            end = subprocess.run(["openssl", "x509", "-noout", "-enddate"], input=api.read_text(),
                                 capture_output=True, text=True, check=True).stdout
            when = dt.datetime.strptime(end.strip().removeprefix("notAfter="),
                                        "%b %d %H:%M:%S %Y %Z").replace(tzinfo=dt.UTC)
            return (when - dt.datetime.now(dt.UTC)).total_seconds() / 86400

        r = node.run("kubeadm", "certs", "renew", "all", "--config", str(config))
        assert r.returncode == 0, r.stderr
        assert "kubeadm-config" not in r.stdout and 9.9 < days_left() <= 10
        r = node.run("kubeadm", "certs", "renew", "all")
        assert r.returncode == 0 and 'from the "kubeadm-config" ConfigMap' in r.stdout
        assert 364.9 < days_left() <= 365

    def test_reconfigure_feature_gates_with_init_phases(
            self, control_plane: tuple[Node, str]) -> None:
        """kubeadm's documented reconfiguration: upload-config and control-plane phases on the
        control plane, `upgrade node phase kubelet-config` + a kubelet restart on each node."""
        node, kc = control_plane
        k = lambda *a: node.run("kubectl", "--kubeconfig", kc, *a)  # noqa: E731
        port = (node.root / "_kubeadm.yaml").read_text().split("bindPort: ")[1].split("}")[0]
        cfg = node.root / "_kubeadm2.yaml"
        cfg.write_text(INIT_CFG.format(port=port)
                       .replace("DRAPartitionableDevices=true", "DRAPartitionableDevices=false")
                       .replace("{ImageVolume: true}", "{ImageVolume: false}"))
        for args in (("upload-config", "all"), ("control-plane", "all")):
            r = node.run("kubeadm", "init", "phase", *args, "--config", str(cfg),
                         "--kubeconfig", kc)
            assert r.returncode == 0, r.stdout + r.stderr
        assert 'Creating static Pod manifest for "kube-scheduler"' in r.stdout
        man = (node.root / "etc/kubernetes/manifests/kube-apiserver.yaml").read_text()
        assert "--feature-gates=DRAPartitionableDevices=false" in man
        # the kubelet restarts the API server for its changed manifest
        wait_for(lambda: 'kubernetes_feature_enabled{name="DRAPartitionableDevices",stage='
                 '"BETA"} 0' in k("get", "--raw", "/metrics").stdout, 60)
        cm = json.loads(k("get", "configmap", "kubelet-config", "-n", "kube-system", "-o",
                          "json").stdout)
        assert "ImageVolume: false" in cm["data"]["kubelet"]
        r = node.run("kubeadm", "upgrade", "node", "phase", "kubelet-config", "--kubeconfig", kc)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "ImageVolume: false" in (node.root / "var/lib/kubelet/config.yaml").read_text()
        subprocess.run(["systemctl", "restart", "kubelet"], env=node.env(), check=True)
        wait_for(lambda: json.loads(k("get", "--raw", "/api/v1/nodes/cp-01/proxy/configz"
                                      ).stdout or "{}").get("kubeletconfig", {}).get(
            "featureGates") == {"ImageVolume": False}, 60)
        r = node.run("kubeadm", "init", "phase", "control-plane", "etcd", "--config", str(cfg))
        assert r.returncode == 1
        assert 'unknown command "etcd" for "kubeadm init phase control-plane"' in r.stderr

    def test_upgrade_version_policy_and_apply(self, control_plane: tuple[Node, str]) -> None:
        node, kc = control_plane
        r = node.run("kubeadm", "upgrade", "apply", "v1.36.2", "--yes", "--kubeconfig", kc)
        assert r.returncode == 1  # no CNI yet, so the control plane node is NotReady
        assert "[ERROR ControlPlaneNodesReady]: there are NotReady control-planes in the " \
            "cluster: [cp-01]" in r.stderr
        up = lambda *a: node.run("kubeadm", "upgrade", *a, "--kubeconfig", kc,  # noqa: E731
                                 "--ignore-preflight-errors=ControlPlaneNodesReady")
        r = up("apply")
        assert r.returncode == 1 and "missing version argument" in r.stderr
        r = up("apply", "v1.36.9", "--yes")
        assert r.returncode == 1
        assert ('- Specified version to upgrade to "v1.36.9" is higher than the kubeadm version '
                '"v1.36.2". Upgrade kubeadm first using the tool you used to install kubeadm'
                in r.stderr) and "Can be bypassed if you pass the --force flag" in r.stderr
        assert "[upgrade/versions] Cluster version: v1.36.2" in r.stdout
        r = up("apply", "v1.36.1", "--yes")
        assert r.returncode == 1 and "Downgrades are not supported yet" in r.stderr
        r = up("apply", "v1.38.0", "--yes")
        assert r.returncode == 1 and "kubeadm can upgrade only 1 minor version at a time" in \
            r.stderr and "--force" not in r.stderr
        r = up("apply", "v1.36.2")  # no --yes and no answer: refuses
        assert r.returncode == 1 and "won't proceed" in r.stderr
        r = up("apply", "v1.36.2", "--yes")
        assert r.returncode == 0, r.stdout + r.stderr
        assert '[upgrade] SUCCESS! A control plane node of your cluster was upgraded to ' \
            '"v1.36.2".' in r.stdout
        backups = list((node.root / "etc/kubernetes/tmp").glob(
            "kubeadm-backup-manifests-*/kube-apiserver.yaml"))
        assert len(backups) == 1
        r = node.run("kubeadm", "upgrade", "apply", "v1.36.2", "--yes",
                     "--kubeconfig", str(node.root / "nowhere.conf"))
        assert r.returncode == 1 and "no such file or directory" in r.stderr

    def test_cni_gpus_smoke_reset(self, control_plane: tuple[Node, str]) -> None:
        node, kc = control_plane
        k = lambda *a, **kw: node.run("kubectl", "--kubeconfig", kc, *a, **kw)  # noqa: E731

        def ready() -> str:
            return k("get", "node", "cp-01", "-o",
                     'jsonpath={.status.conditions[?(@.type=="Ready")].status}').stdout

        assert ready() == "False"
        r = k("apply", "--server-side", "-f", "-", stdin=FLANNEL)
        assert r.returncode == 0, r.stderr
        wait_for(lambda: ready() == "True")
        assert (node.root / "etc/cni/net.d/10-flannel.conflist").exists()
        # device plugin without a loaded driver: no GPUs advertised
        assert k("apply", "--server-side", "-f", "-", stdin=DEVICE_PLUGIN).returncode == 0
        gpus = lambda: k("get", "node", "cp-01", "-o",  # noqa: E731
                         r"jsonpath={.status.allocatable.nvidia\.com/gpu}").stdout
        time.sleep(3)
        assert gpus() == ""
        node.set(smi_rc="0")
        time.sleep(2)
        assert gpus() == ""  # containerd has no nvidia runtime handler yet
        node.set(nvidia=NVIDIA_RT)
        assert wait_for(lambda: gpus() == "2")
        assert k("apply", "-f", "-", stdin=SMOKE).stdout == "pod/gpu-smoke created\n"
        # on this host the pod cannot run (no containerd; GPU pods run in lab nodes in
        # tests/lab/product/test_workloads.py); the kubelet has given it one GPU and written
        # the runner's spec
        uid = k("get", "pod", "gpu-smoke", "-o", "jsonpath={.metadata.uid}").stdout
        spec_file = node.root / f"run/gpuk8s-lab/pods/{uid}/spec.json"
        assert wait_for(lambda: spec_file.exists())
        spec = json.loads(spec_file.read_text())
        assert len(spec["gpus"]) == 1 and spec["gpus"][0].startswith("GPU-")
        assert spec["gpuRuntime"] is True
        assert spec["containers"][0]["command"] == ["nvidia-smi", "-L"]
        # its ServiceAccount's token volume (the API server's admission), set up by the kubelet
        # with its own credentials, and the variables naming the API server: what an
        # in-cluster client reads; kubeadm's serving certificate holds the names it dials
        (token,) = [m for m in spec["containers"][0]["mounts"]
                    if m["dst"] == "/var/run/secrets/kubernetes.io/serviceaccount"]
        assert token["ro"] and sorted(os.listdir(token["src"])) == ["ca.crt", "namespace",
                                                                    "token"]
        assert Path(token["src"], "ca.crt").read_text() == \
            (node.root / "etc/kubernetes/pki/ca.crt").read_text()
        env = spec["containers"][0]["env"]
        assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == (
            "10.96.0.1", "443")
        _, _, sans, _, _ = pki.attributes(
            (node.root / "etc/kubernetes/pki/apiserver.crt").read_text())
        assert {"10.96.0.1", "kubernetes.default.svc"} <= set(sans)
        assert wait_for(lambda: "no container runtime under GPUK8S_LAB_ROOT" in k(
            "get", "events", "-n", "default").stdout)
        r = node.run("kubeadm", "reset", "-f")
        assert r.returncode == 0, r.stderr
        assert "The reset process does not clean CNI configuration. To do so, you must remove " \
            "/etc/cni/net.d" in r.stdout
        assert not (node.root / "etc/kubernetes/admin.conf").exists()
        assert not os.listdir(node.root / "var/lib/etcd")
        assert (node.root / "etc/cni/net.d/10-flannel.conflist").exists()

    def test_kubelet_refuses_unknown_gate_and_swap(self, node: Node) -> None:
        r = node.run("kubelet", timeout=30)
        assert r.returncode == 1
        assert "failed to load kubelet config file, path: /var/lib/kubelet/config.yaml" in \
            r.stderr
        (node.root / "var/lib/kubelet/config.yaml").write_text(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
            "featureGates: {Accelerators: true}\n")
        r = node.run("kubelet", timeout=30)
        assert r.returncode == 1
        assert 'err="failed to set feature gates from initial flags-based config: ' \
            'unrecognized feature gate: Accelerators"' in r.stderr
        (node.root / "var/lib/kubelet/config.yaml").write_text(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n")
        node.swaps.write_text(node.swaps.read_text() + "/swap.img file 4194300 0 -2\n")
        r = node.run("kubelet", timeout=30)
        assert r.returncode == 1 and "running with swap on is not supported" in r.stderr

    def test_kubelet_refuses_cgroup_v1_unless_allowed(self, node: Node) -> None:
        config = node.root / "var/lib/kubelet/config.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\n"
                          "kind: KubeletConfiguration\n")
        r = node.run("kubelet", timeout=30, GPUK8S_LAB_CGROUP="v1")
        assert r.returncode == 1
        assert "kubelet is configured to not run on a host using cgroup v1" in r.stderr
        config.write_text(config.read_text() + "failCgroupV1: false\n")
        r = node.run("kubelet", timeout=30, GPUK8S_LAB_CGROUP="v1")
        assert "cgroup v1" not in r.stderr


def test_the_api_servers_store_is_kubeadms_real_etcd(control_plane: tuple[Node, str]) -> None:
    """kubeadm init writes etcd's static pod; the kubelet runs the REAL etcd from it with
    kubeadm's certificates, and the API server keeps the cluster there: the real etcdctl, with
    the API server's client certificate, reads the namespace the API server created."""
    cp, kc = control_plane
    pki = cp.root / "etc/kubernetes/pki"
    etcdctl = [str(real_etcd("etcdctl")), "--endpoints=https://127.0.0.1:2379",
               f"--cacert={pki / 'etcd/ca.crt'}", f"--cert={pki / 'apiserver-etcd-client.crt'}",
               f"--key={pki / 'apiserver-etcd-client.key'}"]
    members = subprocess.run([*etcdctl, "member", "list", "-w", "json"], capture_output=True,
                             text=True, timeout=30, check=True)
    assert [m["name"] for m in json.loads(members.stdout)["members"]] == ["cp-01"]
    cp.run("kubectl", "--kubeconfig", kc, "create", "namespace", "lab-etcd-check")
    got = subprocess.run([*etcdctl, "get", "/registry/core/namespaces/_cluster/lab-etcd-check",
                          "--print-value-only"], capture_output=True, text=True, timeout=30,
                         check=True)
    assert json.loads(got.stdout)["metadata"]["name"] == "lab-etcd-check"
    # without a client certificate etcd refuses the connection (client-cert-auth, as kubeadm)
    bare = subprocess.run([str(real_etcd("etcdctl")), "--endpoints=https://127.0.0.1:2379",
                           f"--cacert={pki / 'etcd/ca.crt'}", "--command-timeout=3s", "get",
                           "/registry", "--prefix", "--keys-only"], capture_output=True,
                          text=True, timeout=30)
    assert bare.returncode != 0


def test_kubeconfig_user_for_a_lab_user(control_plane: tuple[Node, str]) -> None:
    """`kubeadm kubeconfig user` as gpuk8s's user-kubeconfig runs it: a client certificate
    from the cluster CA with the user as CN and no group, valid the asked period, that the real
    kubectl authenticates as that user; the required flags refused as kubeadm refuses them."""
    node, _ = control_plane
    cfg = str(node.root / "_kubeadm.yaml")
    r = node.run("kubeadm", "kubeconfig", "user", "--config", cfg)
    assert r.returncode == 1 and 'required flag(s) "client-name" not set' in r.stderr
    r = node.run("kubeadm", "kubeconfig", "user", "--config=", "--client-name", "alice")
    assert r.returncode == 1 and "the kubeadm configuration path cannot be empty" in r.stderr
    r = node.run("kubeadm", "kubeconfig", "user", "--config", cfg, "--client-name", "alice",
                 "--validity-period", "24h")
    assert r.returncode == 0, r.stderr
    conf = yaml.safe_load(r.stdout)
    assert conf["current-context"] == "alice@kubernetes"
    cert = base64.b64decode(conf["users"][0]["user"]["client-certificate-data"]).decode()
    cn, orgs, _, server, client = pki.attributes(cert)
    assert (cn, orgs, server, client) == ("alice", [], False, True)
    end = subprocess.run(["openssl", "x509", "-noout", "-enddate"], input=cert, text=True,
                         capture_output=True, check=True).stdout.strip().split("=", 1)[1]
    left = dt.datetime.strptime(end, "%b %d %H:%M:%S %Y %Z").replace(tzinfo=dt.UTC) - \
        dt.datetime.now(dt.UTC)
    assert dt.timedelta(hours=23, minutes=55) < left <= dt.timedelta(hours=24, minutes=1), left
    kc = node.root / "_alice.conf"
    kc.write_text(r.stdout)
    r = node.run("kubectl", "--kubeconfig", str(kc), "auth", "whoami", "-o",
                 "jsonpath={.status.userInfo.username}")
    assert r.returncode == 0 and r.stdout == "alice", r.stderr
    r = node.run("kubectl", "--kubeconfig", str(kc), "auth", "can-i", "list", "nodes")
    assert r.stdout == "no\n"
    r = node.run("kubeadm", "kubeconfig", "user", "--config", cfg, "--client-name", "bob",
                 "--validity-period", "9000h")
    assert r.returncode == 0 and "is longer than the default duration 8760h0m0s" in r.stderr
