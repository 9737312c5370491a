"""What the Kubernetes stand-ins' tests share: a temp node root with fakes of the node's real tools
(Node), an API server stand-in with a REAL etcd (Cluster), kubeadm's InitConfiguration, a few
manifests and waits. Their fixtures (node, cluster, control_plane) are in conftest.py.

No booted nodes: the API server listens on 127.0.0.1 with a temp data dir, kubeadm/kubelet run
against a temp root (GPUK8S_LAB_ROOT), and the node's real tools (ctr, containerd, systemctl,
nvidia-smi) are small fakes on PATH that print what the real ones print.
"""

from __future__ import annotations

import os
import random
import re
import socket
import ssl
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from k8s import kubeconfig, pki

from tests.lab.repos import real_etcd, real_kubectl
from tests.lab.selftest.standins import STANDINS

K8S = STANDINS / "k8s"

#: on every Kubernetes stand-in test module: the stand-ins' PKI is the openssl CLI
NEEDS_OPENSSL = pytest.mark.skipif(
    subprocess.run(["which", "openssl"], capture_output=True).returncode != 0,
    reason="openssl CLI needed")

Obj = dict[str, Any]


def free_port() -> int:
    """A loopback port free now, below Linux's ephemeral range (32768-60999 by default): the
    kernel hands ephemeral ports to every outgoing connection on the machine, and one took an
    etcd's port between this check and etcd's bind once (CI of 0a052d8: "bind: address
    already in use" on 127.0.0.1:60445)."""
    for _ in range(200):
        port = random.randint(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free loopback port in 20000-32000")


# ------------------------------------------------------------------ fakes of the node's real tools
CTR_OK = """TYPE                                      ID                       PLATFORMS      STATUS
io.containerd.content.v1                  content                  -              ok
io.containerd.snapshotter.v1              overlayfs                linux/amd64    ok
io.containerd.cri.v1                      images                   -              ok
io.containerd.cri.v1                      runtime                  linux/amd64    ok
io.containerd.grpc.v1                     cri                      -              ok
"""
DUMP = """version = 3
[plugins]
  [plugins.'io.containerd.cri.v1.runtime']
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
          runtime_type = 'io.containerd.runc.v2'
          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
            SystemdCgroup = {systemd}
"""


class Node:
    """A temp root with fake node tools; `state` files steer what the fakes report."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "_fakebin"
        self.bin.mkdir(parents=True)
        self.state = root / "_state"
        self.state.mkdir()
        for d in ("etc/kubernetes/manifests", "var/lib/kubelet", "var/lib/etcd", "etc/cni/net.d",
                  "proc/sys/net/ipv4", "run/gpuk8s-lab", "var/run/containerd", "var/log"):
            (root / d).mkdir(parents=True, exist_ok=True)
        (root / "proc/sys/net/ipv4/ip_forward").write_text("1\n")
        (root / "usr/lib/gpuk8s-lab/etcd").mkdir(parents=True)  # as the kubelet package puts it
        (root / "usr/lib/gpuk8s-lab/etcd/etcd").symlink_to(real_etcd())
        (root / "etc/hostname").write_text("cp-01\n")
        (root / "etc/os-release").write_text('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n')
        self.swaps = root / "_swaps"
        self.swaps.write_text("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n")
        self.set(ctr=CTR_OK, systemd="true", nvidia="", smi_rc="9", active="0")
        self.sock: socket.socket | None = None
        self.cri_up()
        self._fakes()

    def set(self, **kv: str) -> None:
        for k, v in kv.items():
            (self.state / k).write_text(v)

    def cri_up(self) -> None:
        path = self.root / "var/run/containerd/containerd.sock"
        if path.exists():
            path.unlink()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(64)

    def cri_down(self) -> None:
        if self.sock:
            self.sock.close()
        p = self.root / "var/run/containerd/containerd.sock"
        if p.exists():
            p.unlink()

    def _script(self, name: str, body: str) -> None:
        p = self.bin / name
        p.write_text("#!/bin/sh\n" + textwrap.dedent(body))
        p.chmod(0o755)

    def _fakes(self) -> None:
        st, root = self.state, self.root
        self._script("ctr", f'cat "{st}/ctr"\n')
        self._script("containerd", f"""\
            if [ "$1" = "--version" ]; then
              echo "containerd github.com/containerd/containerd/v2 v2.1.4 75cb2b7193e4"
              exit 0
            fi
            sed "s/{{systemd}}/$(cat {st}/systemd)/" <<'EOF'
            {DUMP}EOF
            cat "{st}/nvidia"
            """)
        kubelet = K8S / "kubelet"
        self._script("systemctl", f"""\
            api={root}/run/gpuk8s-lab/kube-apiserver-standin.pid
            etcd={root}/run/gpuk8s-lab/etcd-static-pod.pid
            case "$1" in
              is-active) [ "$3" = containerd ] && exit $(cat {st}/active); exit 1;;
              is-enabled) exit 0;;
              restart|start)
                if [ "$2" = kubelet ]; then
                  kill $(cat {root}/run/kubelet.pid 2>/dev/null) 2>/dev/null && sleep 0.3
                  . {root}/var/lib/kubelet/kubeadm-flags.env
                  nohup {sys.executable} {kubelet} --config=/var/lib/kubelet/config.yaml \\
                    --kubeconfig=/etc/kubernetes/kubelet.conf $KUBELET_KUBEADM_ARGS \\
                    >>{root}/var/log/kubelet.log 2>&1 &
                  echo $! > {root}/run/kubelet.pid
                fi;;
              stop)
                if [ "$2" = kubelet ] && [ -f {root}/run/kubelet.pid ]; then
                  kill $(cat {root}/run/kubelet.pid) 2>/dev/null; rm -f {root}/run/kubelet.pid
                fi
                if [ "$2" = kube-apiserver-standin ] && [ -f "$api" ]; then
                  kill $(cat "$api") 2>/dev/null; sleep 0.3
                fi
                if [ "$2" = etcd-static-pod ] && [ -f "$etcd" ]; then
                  kill $(cat "$etcd") 2>/dev/null; sleep 0.3
                fi;;
            esac
            exit 0
            """)
        self._script("nvidia-smi", f"""\
            rc=$(cat {st}/smi_rc)
            if [ "$rc" != 0 ]; then
              echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA" \
                "driver. Make sure that the latest NVIDIA driver is installed and running."
              exit $rc
            fi
            echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-11111111-2222-3333-4444-555555555555)"
            echo "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-66666666-7777-8888-9999-000000000000)"
            """)
        for tool in ("crictl", "conntrack"):
            self._script(tool, "exit 0\n")
        (self.bin / "kubelet").symlink_to(kubelet)

    def add_gpus(self, n: int) -> None:
        for i in range(n):
            d = self.root / f"sys/bus/pci/devices/0000:00:0{6 + i}.0"
            d.mkdir(parents=True)
            (d / "vendor").write_text("0x10de\n")
            (d / "device").write_text("0x2330\n")
            (d / "class").write_text("0x030200\n")

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"GPUK8S_LAB_ROOT": str(self.root), "PATH": f"{self.bin}:{env['PATH']}",
                    "GPUK8S_LAB_PROC_SWAPS": str(self.swaps), "GPUK8S_LAB_NO_SYSTEMD": "1",
                    "GPUK8S_LAB_KUBELET_PERIOD": "0.5",
                    "GPUK8S_LAB_CONTROLLER_PERIOD": "0.2", "PYTHONPATH": str(STANDINS),
                    "GPUK8S_LAB_CGROUP": "v2"})
        env.update(extra)
        return env

    def run(self, tool: str, *args: str, stdin: str | None = None, timeout: float = 120,
            **env: str) -> subprocess.CompletedProcess[str]:
        cmd = [str(real_kubectl())] if tool == "kubectl" else [sys.executable, str(K8S / tool)]
        try:
            return subprocess.run([*cmd, *args], input=stdin,
                                  capture_output=True, text=True, env=self.env(**env),
                                  timeout=timeout)
        except subprocess.TimeoutExpired as exc:  # what it printed says where it hung
            out = "".join(b.decode(errors="replace") if isinstance(b, bytes) else b or ""
                          for b in (exc.stdout, exc.stderr))
            raise AssertionError(f"{tool} {' '.join(args)}: no exit within {timeout:.0f} s; "
                                 f"it printed:\n{out[-4000:]}") from None

    def cleanup(self) -> None:
        for pidfile in ("run/kubelet.pid", "run/gpuk8s-lab/kube-apiserver-standin.pid",
                        "run/gpuk8s-lab/etcd-static-pod.pid"):
            p = self.root / pidfile
            if not p.exists():
                continue
            try:
                pid = int(p.read_text())
                os.kill(pid, 15)
                for _ in range(50):
                    os.kill(pid, 0)
                    time.sleep(0.1)
            except (ValueError, OSError):
                pass
        self.cri_down()


# ------------------------------------------------------------------ a running API server
class Cluster:
    def __init__(self, root: Path, gates: str = "", etcd_port: int | None = None,
                 env: dict[str, str] | None = None, sa_key: bool = False) -> None:
        """An API server stand-in on this machine with a REAL etcd of its own, or sharing the
        etcd at ``etcd_port`` (another Cluster's: two control planes of one cluster);
        ``sa_key``: with a ServiceAccount signing key (sa.key, as kubeadm's
        --service-account-signing-key-file), so that it serves TokenRequests."""
        self.root = root
        self.port = free_port()
        pk = root / "pki"
        pk.mkdir(parents=True)
        os.environ["GPUK8S_LAB_ROOT"] = "/"
        ca, cakey = str(pk / "ca.crt"), str(pk / "ca.key")
        pki.gen_ca(ca, cakey)
        pki.issue(str(pk / "apiserver.crt"), str(pk / "apiserver.key"), ca, cakey,
                  "kube-apiserver", server=True, client=False, sans=["127.0.0.1", "localhost"])
        pki.issue(str(pk / "admin.crt"), str(pk / "admin.key"), ca, cakey, "kubernetes-admin",
                  orgs=["system:masters"])
        self.sa_key = pk / "sa.key" if sa_key else None
        if self.sa_key is not None:
            pki.gen_key(str(self.sa_key))
        self.ca_pem = (pk / "ca.crt").read_text()
        self.server = f"https://127.0.0.1:{self.port}"
        # the API server's store: a REAL etcd of its own (plain http on this machine; the
        # lab's etcd is TLS with kubeadm's certificates)
        self.etcd: subprocess.Popen[bytes] | None = None
        self.etcd_port = etcd_port or free_port()
        if etcd_port is None:
            peer = free_port()
            self.etcd = subprocess.Popen(
                [str(real_etcd()), f"--data-dir={root / 'etcd'}", "--name=standin",
                 f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
                 f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
                 f"--listen-peer-urls=http://127.0.0.1:{peer}",
                 f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                 f"--initial-cluster=standin=http://127.0.0.1:{peer}", "--unsafe-no-fsync"],
                stdout=subprocess.DEVNULL, stderr=open(root / "etcd.log", "w"))  # noqa: SIM115
        self.kubeconfig = root / "admin.conf"
        self.gates, self.env = gates, env or {}
        self.log = open(root / "apiserver.log", "w")  # noqa: SIM115
        for _attempt in range(5):
            self.proc = self.launch()
            if self.wait_listening():
                break
            # free_port's port was taken by another process before the API server bound it
            # (CI of 8ef863b: the server exited "Address already in use" while the test's
            # requests went to the other listener): another port, the same server, a new log
            self.port = free_port()
            self.server = f"https://127.0.0.1:{self.port}"
            self.log.seek(0)
            self.log.truncate()
        else:
            raise AssertionError("the API server found its port taken five times")
        self.kubeconfig.write_text(kubeconfig.build(
            self.server, self.ca_pem, "kubernetes-admin",
            cert_pem=(pk / "admin.crt").read_text(), key_pem=(pk / "admin.key").read_text()))
        from k8s.client import Client

        self.client = Client(kubeconfig.load(str(self.kubeconfig)))

    def launch(self) -> subprocess.Popen[bytes]:
        """Start this cluster's API server (again: a restart keeps its port, flags and log)."""
        pk = self.root / "pki"
        args = [sys.executable, "-m", "k8s.apiserver", f"--secure-port={self.port}",
                "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                f"--client-ca-file={pk / 'ca.crt'}", f"--tls-cert-file={pk / 'apiserver.crt'}",
                f"--tls-private-key-file={pk / 'apiserver.key'}",
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}"]
        if self.gates:
            args.append(f"--feature-gates={self.gates}")
        if self.sa_key is not None:
            args.append(f"--service-account-signing-key-file={self.sa_key}")
        return subprocess.Popen(args, stderr=self.log, stdout=self.log, env={
            **os.environ, "PYTHONPATH": str(STANDINS), "GPUK8S_LAB_CONTROLLER_PERIOD": "0.2",
            **self.env})

    def wait_listening(self, timeout: float = 60) -> bool:
        """Until this API server answers a TLS handshake with its own certificate (another
        process on the port cannot: the CA is this cluster's). It imports its CEL library and
        waits for its etcd first: seconds on a loaded 2-core CI machine (10 s was once not
        enough). False when it exited because the port was taken."""
        ctx = ssl.create_default_context(cadata=self.ca_pem)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.flush()
                text = (self.root / "apiserver.log").read_text()
                if "Address already in use" in text:
                    return False
                raise AssertionError(f"the API server exited {self.proc.returncode}:\n"
                                     + text[-3000:])
            if self.etcd is not None and self.etcd.poll() is not None:
                raise AssertionError(f"its etcd exited {self.etcd.returncode}:\n"
                                     + (self.root / "etcd.log").read_text()[-3000:])
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.5) as sock, \
                        ctx.wrap_socket(sock, server_hostname="127.0.0.1"):
                    return True
            except (OSError, ssl.SSLError):
                time.sleep(0.1)
        raise AssertionError(f"the API server did not listen on {self.port} in {timeout:.0f} s")

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 60
                ) -> subprocess.CompletedProcess[str]:
        """The REAL kubectl (Debian sid's 1.36) against this API server stand-in."""
        return subprocess.run([str(real_kubectl()), "--kubeconfig", str(self.kubeconfig), *args],
                              input=stdin, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "HOME": str(self.root)})

    def add_node(self, name: str, cpu: str = "8", memory: str = "32Gi", gpus: int = 0,
                 ready: bool = True, taints: list[Obj] | None = None,
                 labels: dict[str, str] | None = None) -> None:
        cap = {"cpu": cpu, "memory": memory, "pods": "110"}
        if gpus:
            cap["nvidia.com/gpu"] = str(gpus)
        from k8s.common import ts

        self.client.request("POST", "/api/v1/nodes", {
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                  **(labels or {})}},
            "spec": {"taints": taints} if taints else {}})
        node = self.client.get(f"/api/v1/nodes/{name}")
        node["status"] = {"capacity": cap, "allocatable": cap, "conditions": [
            {"type": "Ready", "status": "True" if ready else "False",
             "reason": "KubeletReady", "lastHeartbeatTime": ts(), "lastTransitionTime": ts()}],
            "nodeInfo": {"kubeletVersion": "v1.36.2"},
            "addresses": [{"type": "InternalIP", "address": "10.88.0.99"}]}
        self.client.request("PUT", f"/api/v1/nodes/{name}/status", node)

    def wait(self, fn: Any, timeout: float = 10) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = fn()
            if v:
                return v
            time.sleep(0.1)
        raise AssertionError("condition not reached")

    def ident(self) -> str:
        """This API server's identity in leader election (from its log)."""
        self.log.flush()
        m = re.search(r"leader lease kube-system/kube-controller-manager as (\S+)\.\.\.",
                      (self.root / "apiserver.log").read_text())
        return m.group(1) if m else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        if self.etcd is not None:
            self.etcd.terminate()
            self.etcd.wait(10)
        self.log.close()


CP_TAINT = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}


def gpu_pod(name: str, gpus: int = 1, **spec: Any) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "cuda", "image": "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0",
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}], **spec}}


INIT_CFG = """apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint: {{advertiseAddress: 127.0.0.1, bindPort: {port}}}
nodeRegistration:
  name: cp-01
  kubeletExtraArgs:
  - name: node-ip
    value: 127.0.0.1
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
networking: {{podSubnet: 10.244.0.0/16}}
apiServer:
  extraArgs:
  - name: feature-gates
    value: DRAPartitionableDevices=true
---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
featureGates: {{ImageVolume: true}}
"""


FLANNEL = """apiVersion: v1
kind: Namespace
metadata: {name: kube-flannel}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: kube-flannel-cfg, namespace: kube-flannel}
data:
  cni-conf.json: |
    {"name": "cbr0", "cniVersion": "0.3.1", "plugins": [
      {"type": "flannel", "delegate": {"hairpinMode": true, "isDefaultGateway": true}},
      {"type": "portmap", "capabilities": {"portMappings": true}}]}
  net-conf.json: |
    {"Network": "10.244.0.0/16", "EnableNFTables": false, "Backend": {"Type": "vxlan"}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: kube-flannel-ds, namespace: kube-flannel}
spec:
  selector: {matchLabels: {app: flannel}}
  template:
    metadata: {labels: {app: flannel}}
    spec:
      hostNetwork: true
      tolerations: [{operator: Exists, effect: NoSchedule}]
      initContainers:
      - {name: install-cni, image: "ghcr.io/flannel-io/flannel:v0.28.9", command: [cp]}
      containers:
      - name: kube-flannel
        image: "ghcr.io/flannel-io/flannel:v0.28.9"
        command: [/opt/bin/flanneld]
      volumes:
      - {name: flannel-cfg, configMap: {name: kube-flannel-cfg}}
"""


def wait_for(fn: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.3)
    raise AssertionError("condition not reached")


def kubectl_ok(cluster: Cluster, *args: str, stdin: str | None = None) -> str:
    r = cluster.kubectl(*args, stdin=stdin)
    assert r.returncode == 0, (args, r.stderr)
    return r.stdout
