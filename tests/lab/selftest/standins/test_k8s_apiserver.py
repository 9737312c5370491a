"""Unit tests of the Kubernetes lab stand-ins (tests/lab/standins/k8s), run on the lab host.

No booted nodes: the API server listens on 127.0.0.1 with a temp data dir, kubeadm/kubelet run
against a temp root (GPUK8S_LAB_ROOT), and the node's real tools (ctr, containerd, systemctl,
nvidia-smi) are small fakes on PATH that print what the real ones print.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import secrets
import socket
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

STANDINS = Path(__file__).resolve().parents[2] / "standins"
K8S = STANDINS / "k8s"
sys.path.insert(0, str(STANDINS))

from k8s import dns, featuregates, flannel_cni, kubeconfig, pki, proxy, realpods, scheduler  # noqa: E402
from k8s.common import format_duration, parse_duration, parse_quantity  # noqa: E402
from k8s.kubeadm import cluster_info_kubeconfig, create_token_secret  # noqa: E402
from k8s.kubeadm_config import ConfigError, decode  # noqa: E402
from k8s.tables import tabwriter  # noqa: E402

from tests.lab.repos import real_etcd, real_kubectl  # noqa: E402

pytestmark = pytest.mark.skipif(
    subprocess.run(["which", "openssl"], capture_output=True).returncode != 0,
    reason="openssl CLI needed")

Obj = dict[str, Any]


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


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
NVIDIA_RT = """        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]
          runtime_type = 'io.containerd.runc.v2'
          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]
            BinaryName = '/usr/bin/nvidia-container-runtime'
            SystemdCgroup = true
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
        return subprocess.run([*cmd, *args], input=stdin,
                              capture_output=True, text=True, env=self.env(**env),
                              timeout=timeout)

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


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "node")
    yield n
    n.cleanup()


# ------------------------------------------------------------------ a running API server
class Cluster:
    def __init__(self, root: Path, gates: str = "", etcd_port: int | None = None,
                 env: dict[str, str] | None = None) -> None:
        """An API server stand-in on this machine with a REAL etcd of its own, or sharing the
        etcd at ``etcd_port`` (another Cluster's: two control planes of one cluster)."""
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
        self.kubeconfig.write_text(kubeconfig.build(
            self.server, self.ca_pem, "kubernetes-admin",
            cert_pem=(pk / "admin.crt").read_text(), key_pem=(pk / "admin.key").read_text()))
        args = [sys.executable, "-m", "k8s.apiserver", f"--secure-port={self.port}",
                "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                f"--client-ca-file={ca}", f"--tls-cert-file={pk / 'apiserver.crt'}",
                f"--tls-private-key-file={pk / 'apiserver.key'}",
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}"]
        if gates:
            args.append(f"--feature-gates={gates}")
        self.log = open(root / "apiserver.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(args, stderr=self.log, stdout=self.log, env={
            **os.environ, "PYTHONPATH": str(STANDINS), "GPUK8S_LAB_CONTROLLER_PERIOD": "0.2",
            **(env or {})})
        self.wait_listening()
        from k8s.client import Client

        self.client = Client(kubeconfig.load(str(self.kubeconfig)))

    def wait_listening(self, timeout: float = 60) -> None:
        """Until the API server accepts connections. It imports its CEL library and waits for
        its etcd first: seconds on a loaded 2-core CI machine (10 s was once not enough)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.flush()
                raise AssertionError(f"the API server exited {self.proc.returncode}:\n"
                                     + (self.root / "apiserver.log").read_text()[-3000:])
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
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


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "cluster", gates="DRAPartitionableDevices=true")
    yield c
    c.stop()


CP_TAINT = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}


def gpu_pod(name: str, gpus: int = 1, **spec: Any) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "cuda", "image": "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0",
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}], **spec}}


# ================================================================== pure logic
def node_obj(name: str, gpus: int = 0, taints: list[Obj] | None = None, **kw: Any) -> Obj:
    alloc = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    if gpus:
        alloc["nvidia.com/gpu"] = str(gpus)
    return {"metadata": {"name": name, "labels": kw.get("labels", {})},
            "spec": {"taints": taints or [], "unschedulable": kw.get("unschedulable", False)},
            "status": {"allocatable": alloc}}


class TestScheduler:
    def test_gpu_fits(self) -> None:
        nodes = [node_obj("cp-01", taints=[CP_TAINT]), node_obj("gpu-01", 2)]
        assert scheduler.schedule(gpu_pod("p"), nodes, []) == ("gpu-01", "")

    def test_gpu_does_not_fit_real_text(self) -> None:
        nodes = [node_obj("cp-01", taints=[CP_TAINT]), node_obj("gpu-01", 2),
                 node_obj("gpu-02", 1), node_obj("cpu-01")]
        # 1.34+: DynamicResources' PostFilter speaks for every pod (the API server's
        # scheduler passes it, dra_server.schedule)
        node, msg = scheduler.schedule(gpu_pod("p", 4), nodes, [],
                                       postfilter="no new claims to deallocate")
        assert node is None
        assert msg == ("0/4 nodes are available: 1 node(s) had untolerated taint(s), 3 "
                       "Insufficient nvidia.com/gpu. no new claims to deallocate, preemption: 0/4"
                       " nodes are available: 1 Preemption is not helpful for scheduling, 3 No "
                       "preemption victims found for incoming pod.")

    def test_single_node_message_matches_reference(self) -> None:
        """The reference capture (before 1.34, no DynamicResources plugin); 1.34+ adds its
        PostFilter's "no new claims to deallocate, " before "preemption:"."""
        _, msg = scheduler.schedule(gpu_pod("p"), [node_obj("n", 0)], [])
        assert msg == ("0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 "
                       "nodes are available: 1 No preemption victims found for incoming pod.")

    def test_bound_pods_use_gpus(self) -> None:
        bound = gpu_pod("a", 2)
        bound["spec"]["nodeName"] = "gpu-01"
        bound["status"] = {"phase": "Running"}
        node, _ = scheduler.schedule(gpu_pod("b"), [node_obj("gpu-01", 2)], [bound])
        assert node is None
        bound["status"]["phase"] = "Succeeded"
        assert scheduler.schedule(gpu_pod("b"), [node_obj("gpu-01", 2)], [bound])[0] == "gpu-01"

    def test_tolerations_node_selector_cordon(self) -> None:
        nodes = [node_obj("cp-01", 1, taints=[CP_TAINT]),
                 node_obj("gpu-01", 1, labels={"gpu": "h100"}, unschedulable=True),
                 node_obj("gpu-02", 1, labels={"gpu": "h200"})]
        pod = gpu_pod("p", nodeSelector={"gpu": "h100"})
        node, msg = scheduler.schedule(pod, nodes, [])
        assert node is None
        assert msg.startswith("0/3 nodes are available: 1 node(s) didn't match Pod's node "
                              "affinity/selector, 1 node(s) had untolerated taint(s), 1 node(s) "
                              "were unschedulable.")
        pod["spec"]["tolerations"] = [{"key": "node-role.kubernetes.io/control-plane",
                                       "operator": "Exists", "effect": "NoSchedule"}]
        pod["spec"]["nodeSelector"] = {}
        assert scheduler.schedule(pod, nodes, [])[0] in ("cp-01", "gpu-02")

    def test_requests_cpu_memory(self) -> None:
        pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "resources": {
            "requests": {"cpu": "9", "memory": "1Gi"}}}]}}
        _, msg = scheduler.schedule(pod, [node_obj("a")], [])
        assert "1 Insufficient cpu" in msg

    def test_quantities_and_durations(self) -> None:
        assert parse_quantity("100m") * 10 == 1
        assert parse_quantity("57584828Ki") == 57584828 * 1024
        assert parse_duration("15m0s") == 900 and format_duration(900) == "15m0s"
        assert format_duration(86400) == "24h0m0s"
        with pytest.raises(ValueError):
            parse_duration("15 minutes")


def dns_query(name: str, qtype: int = 1) -> bytes:
    labels = b"".join(bytes([len(x)]) + x.encode() for x in name.split("."))
    return struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + labels + b"\0" + \
        struct.pack("!HH", qtype, 1)


class FakeApi:
    """What the DNS stand-in reads: Services and pods of one namespace."""

    def __init__(self, services: dict[str, Obj], pods: list[Obj]) -> None:
        self.services, self.pods = services, pods

    def get(self, path: str) -> Obj:
        from k8s.client import ApiError

        if path.endswith("/pods"):
            return {"items": self.pods}
        name = path.rsplit("/", 1)[-1]
        if name not in self.services:
            raise ApiError(404, {"reason": "NotFound", "message": f"services {name} not found"})
        return self.services[name]


class TestEmulatedNetwork:
    """The pure parts of the lab's pod network: flannel's delegate config, kube-proxy's rules
    and the cluster DNS answers (their effect on real nodes:
    tests/lab/product/test_workloads.py)."""

    def test_flannel_delegates_to_bridge_over_the_nodes_lease(self) -> None:
        env = {"FLANNEL_NETWORK": "10.244.0.0/16", "FLANNEL_SUBNET": "10.244.2.1/24",
               "FLANNEL_MTU": "1450", "FLANNEL_IPMASQ": "true"}
        conf = {"name": "cbr0", "cniVersion": "0.3.1",
                "delegate": {"hairpinMode": True, "isDefaultGateway": True}}
        got = flannel_cni.delegate_config(conf, env)
        assert got["type"] == "bridge" and got["isGateway"] is True
        assert got["ipMasq"] is False and got["mtu"] == 1450
        assert got["ipam"] == {"type": "host-local", "ranges": [[{"subnet": "10.244.2.0/24"}]],
                               "routes": [{"dst": "10.244.0.0/16"}]}

    def test_kube_proxy_rules_for_a_node_port(self) -> None:
        svc = {"metadata": {"name": "jupyter", "namespace": "ml"},
               "spec": {"type": "NodePort", "clusterIP": "10.96.0.7",
                        "selector": {"app": "j"},
                        "ports": [{"name": "http", "port": 8888, "targetPort": "http",
                                   "nodePort": 30888}]}}
        ready = [{"type": "Ready", "status": "True"}]
        pod = {"metadata": {"name": "j-1", "namespace": "ml", "labels": {"app": "j"}},
               "spec": {"containers": [{"ports": [{"name": "http", "containerPort": 8888}]}]},
               "status": {"phase": "Running", "podIP": "10.244.2.5", "conditions": ready}}
        not_ready = json.loads(json.dumps(pod))
        not_ready["status"].update(podIP="10.244.3.9", conditions=[])
        text = proxy.rules([svc], [pod, not_ready])
        assert "-A KUBE-SERVICES -d 10.96.0.7/32 -p tcp -m tcp --dport 8888 -m comment " \
            '--comment "ml/jupyter:http cluster IP" -j DNAT --to-destination 10.244.2.5:8888' \
            in text
        assert "-A KUBE-NODEPORTS -p tcp -m tcp --dport 30888 -j KUBE-MARK-MASQ" in text
        assert "10.244.3.9" not in text   # not ready: no endpoint
        two = json.loads(json.dumps(pod))
        two["status"]["podIP"] = "10.244.1.4"
        spread = [ln for ln in proxy.rules([svc], [pod, two]).splitlines() if "cluster IP" in ln]
        assert "--probability 0.50000" in spread[0] and "probability" not in spread[1]

    def test_cluster_dns_answers(self) -> None:
        svc = {"spec": {"clusterIP": "None", "selector": {"app": "w"},
                        "publishNotReadyAddresses": True}}
        pods = [{"metadata": {"name": f"w-{i}", "labels": {"app": "w"}},
                 "spec": {"hostname": f"w-{i}", "subdomain": "peers"},
                 "status": {"phase": "Running", "podIP": f"10.244.{i}.2"}} for i in (1, 2)]
        web = {"spec": {"clusterIP": "10.96.0.9", "selector": {"app": "x"}}}
        server = dns.ClusterDNS(FakeApi({"peers": svc, "web": web}, pods),  # type: ignore[arg-type]
                                "cluster.local")
        assert server.resolve("peers.ml.svc.cluster.local") == (0, ["10.244.1.2", "10.244.2.2"])
        assert server.resolve("w-2.peers.ml.svc.cluster.local") == (0, ["10.244.2.2"])
        assert server.resolve("web.ml.svc.cluster.local") == (0, ["10.96.0.9"])
        assert server.resolve("nope.ml.svc.cluster.local") == (dns.NXDOMAIN, [])
        assert server.resolve("10-244-1-2.ml.pod.cluster.local") == (0, ["10.244.1.2"])
        assert server.resolve("pypi.org")[0] == dns.REFUSED
        reply = server.handle(dns_query("w-1.peers.ml.svc.cluster.local"))
        assert reply is not None
        qid, flags, _qd, ancount = struct.unpack("!HHHH", reply[:8])
        assert qid == 0x1234 and flags & 0x8000 and flags & 0xF == 0 and ancount == 1
        assert socket.inet_ntoa(reply[-4:]) == "10.244.1.2"
        reply = server.handle(dns_query("w-1.peers.ml.svc.cluster.local", qtype=28))
        assert reply is not None and struct.unpack("!H", reply[6:8])[0] == 0   # no AAAA

    def test_pod_spec_resolves_env_and_volumes(self, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("GPUK8S_LAB_ROOT", str(tmp_path))

        class Api:
            def get(self, path: str) -> Obj:
                if path.endswith("/secrets/tok"):
                    return {"data": {"token": base64.b64encode(b"s3cret").decode()}}
                if path.endswith("/configmaps/script"):
                    return {"data": {"train.py": "print(1)\n"}}
                from k8s.client import ApiError
                raise ApiError(404, {"reason": "NotFound", "message": path})

        pod = {"metadata": {"name": "p", "namespace": "ml", "uid": "u-1",
                            "annotations": {"batch.kubernetes.io/job-completion-index": "1"}},
               "spec": {"nodeName": "gpu-01", "restartPolicy": "Never", "volumes": [
                   {"name": "s", "configMap": {"name": "script"}},
                   {"name": "scratch", "emptyDir": {}}],
                   "containers": [{"name": "c", "image": "tensorflow/tensorflow:2.21.0",
                                   "command": ["python3", "/opt/s/train.py"],
                                   "resources": {"limits": {"memory": "1Gi", "cpu": "500m"}},
                                   "volumeMounts": [{"name": "s", "mountPath": "/opt/s",
                                                     "readOnly": True}],
                                   "env": [{"name": "T", "valueFrom": {"secretKeyRef": {
                                       "name": "tok", "key": "token"}}},
                                           {"name": "I", "valueFrom": {"fieldRef": {
                                               "fieldPath": "metadata.annotations['batch."
                                                            "kubernetes.io/job-completion-"
                                                            "index']"}}}]}]}}
        spec = realpods.prepare(Api(), pod, "10.88.0.12", ["GPU-1"], True,  # type: ignore[arg-type]
                                "/var/log/pods/ml_p_u-1", {"clusterDNS": ["10.96.0.10"]})
        (c,) = spec["containers"]
        assert c["env"] == {"T": "s3cret", "I": "1"}
        assert (c["memory"], c["cpus"]) == (1 << 30, 0.5)
        (mount,) = c["mounts"]
        assert mount["dst"] == "/opt/s" and mount["ro"] is True
        assert Path(mount["src"], "train.py").read_text() == "print(1)\n"
        assert spec["hostname"] == "p" and spec["clusterDNS"] == ["10.96.0.10"]
        missing = json.loads(json.dumps(pod))
        missing["spec"]["volumes"][0]["configMap"]["name"] = "gone"
        with pytest.raises(realpods.VolumeError, match='configmap "gone" not found'):
            realpods.prepare(Api(), missing, "10.88.0.12", [], False,  # type: ignore[arg-type]
                             "/x", {})


class TestKubeadmConfig:
    INIT = """apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
nodeRegistration:
  kubeletExtraArgs:
  - name: node-ip
    value: 10.88.0.11
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
apiServer:
  extraArgs:
  - name: feature-gates
    value: DRAPartitionableDevices=true
---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
featureGates: {InPlacePodVerticalScaling: true}
"""

    def test_v1beta4_ok(self) -> None:
        assert set(decode(self.INIT)) == {"InitConfiguration", "ClusterConfiguration",
                                          "KubeletConfiguration"}

    def test_v1beta3_removed(self) -> None:
        with pytest.raises(ConfigError, match=r'no kind "InitConfiguration" is registered for '
                           r'version "kubeadm\.k8s\.io/v1beta3"'):
            decode(self.INIT.replace("v1beta4", "v1beta3", 1))

    def test_extra_args_map_refused(self) -> None:
        bad = self.INIT.replace("  extraArgs:\n  - name: feature-gates\n    value: "
                                "DRAPartitionableDevices=true", "  extraArgs:\n    "
                                "feature-gates: DRAPartitionableDevices=true")
        with pytest.raises(ConfigError, match=r"cannot unmarshal object into Go struct field "
                           r"APIServer\.apiServer\.extraArgs of type \[\]v1beta4\.Arg"):
            decode(bad)

    def test_unknown_field(self) -> None:
        with pytest.raises(ConfigError, match='strict decoding error: unknown field "foo"'):
            decode(self.INIT.replace("kind: InitConfiguration", "kind: InitConfiguration\nfoo: 1"))

    @pytest.mark.parametrize("where", ["kubelet", "apiserver"])
    def test_accelerators_gate_unknown(self, where: str) -> None:
        if where == "kubelet":
            text = self.INIT.replace("InPlacePodVerticalScaling", "Accelerators")
        else:
            text = self.INIT.replace("DRAPartitionableDevices=true", "Accelerators=true")
        with pytest.raises(ConfigError, match="unrecognized feature gate: Accelerators"):
            decode(text)

    def test_locked_gate(self) -> None:
        with pytest.raises(featuregates.GateError, match="locked to true"):
            featuregates.validate({"DynamicResourceAllocation": False})
        assert featuregates.validate({"NodeSwap": True}) == {"NodeSwap": True}


class TestOutputHelpers:
    def test_table_padding(self) -> None:
        out = tabwriter([["NAME", "STATUS", "ROLES", "AGE", "VERSION"],
                     ["gpu-01", "Ready", "<none>", "2m", "v1.36.2"],
                     ["cp-01", "Ready", "control-plane", "10m", "v1.36.2"]])
        assert out.splitlines()[1] == "gpu-01   Ready    <none>          2m    v1.36.2"


# ================================================================== API server + kubectl
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
        args = cluster.proc.args
        cluster.proc = subprocess.Popen(args, stderr=cluster.log, stdout=cluster.log, env={
            **os.environ, "PYTHONPATH": str(STANDINS)})
        cluster.wait_listening()
        cluster.wait(lambda: cluster.kubectl("get", "node", "gpu-01").returncode == 0)


# ================================================================== kubeadm
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


def preflight_errors(r: subprocess.CompletedProcess[str]) -> list[str]:
    return [ln.strip() for ln in r.stderr.splitlines() if ln.startswith("\t[ERROR ")]


class TestKubeadmPreflight:
    def cfg(self, node: Node, text: str | None = None) -> str:
        p = node.root / "_kubeadm.yaml"
        p.write_text(text or INIT_CFG.format(port=free_port()))
        return str(p)

    @pytest.mark.parametrize(("argv", "message"), [pytest.param(argv, message, id="-".join(argv))
                                                  for argv, message in [
        (("version",), 'unknown command "version" for "kubeadm"'),
        (("certs", "certificate-key"), 'unknown command "certs" for "kubeadm"'),
        (("token", "list"), 'unknown command "list" for "kubeadm token"'),
        (("token", "delete", "abcdef"), 'unknown command "delete" for "kubeadm token"'),
        (("token", "generate"), 'unknown command "generate" for "kubeadm token"'),
        (("upgrade", "plan"), 'unknown command "plan" for "kubeadm upgrade"')]])
    def test_subcommands_gpuk8s_never_runs_are_refused(self, node: Node, argv: tuple[str, ...],
                                                       message: str) -> None:
        """The stand-in plays what gpuk8s runs (CONTRACT.md); anything else is refused as
        real kubeadm refuses a command it does not have, never half-played."""
        r = node.run("kubeadm", *argv)
        assert r.returncode == 1 and r.stderr.startswith(message), r.stderr

    def test_config_validate(self, node: Node) -> None:
        assert node.run("kubeadm", "config", "validate", "--config", self.cfg(node)
                        ).returncode == 0
        r = node.run("kubeadm", "config", "validate", "--config",
                     self.cfg(node, INIT_CFG.format(port=1).replace("v1beta4", "v1beta3")))
        assert r.returncode == 1
        assert 'no kind "InitConfiguration" is registered for version "kubeadm.k8s.io/v1beta3"' \
            in r.stderr

    def test_init_refuses_swap_ipforward(self, node: Node) -> None:
        node.swaps.write_text(node.swaps.read_text() + "/swap.img file 4194300 0 -2\n")
        (node.root / "proc/sys/net/ipv4/ip_forward").write_text("0\n")
        r = node.run("kubeadm", "init", "--config", self.cfg(node), "--skip-token-print")
        assert r.returncode == 1
        assert r.stdout.splitlines()[1] == "[preflight] Running pre-flight checks"
        assert preflight_errors(r) == [
            "[ERROR Swap]: running with swap on is not supported. Please disable swap",
            "[ERROR FileContent--proc-sys-net-ipv4-ip_forward]: /proc/sys/net/ipv4/ip_forward "
            "contents are not set to 1"]
        assert r.stderr.startswith("error execution phase preflight: [preflight] Some fatal "
                                   "errors occurred:\n")
        assert "--ignore-preflight-errors=..." in r.stderr
        assert r.stderr.rstrip().endswith("To see the stack trace of this error execute with "
                                          "--v=5 or higher")
        r = node.run("kubeadm", "init", "--config", self.cfg(node),
                     "--ignore-preflight-errors=Swap,FileContent--proc-sys-net-ipv4-ip_forward",
                     "--dry-run-not-a-flag")
        assert r.returncode == 1  # unknown flag refused before doing anything

    def test_swap_allowed_when_failswapon_false(self, node: Node) -> None:
        node.swaps.write_text(node.swaps.read_text() + "/swap.img file 4194300 0 -2\n")
        node.cri_down()
        text = INIT_CFG.format(port=free_port()) + "failSwapOn: false\n"
        r = node.run("kubeadm", "init", "--config", self.cfg(node, text))
        assert not any("Swap" in e for e in preflight_errors(r))
        assert "[WARNING Swap]" in r.stdout

    def test_cri_socket_missing(self, node: Node) -> None:
        node.cri_down()
        r = node.run("kubeadm", "init", "--config", self.cfg(node))
        errs = preflight_errors(r)
        assert errs[0].startswith("[ERROR CRI]: container runtime is not running: validate "
                                  "service connection: validate CRI v1 runtime API for endpoint "
                                  '"unix:///var/run/containerd/containerd.sock"')

    def test_cri_plugin_disabled(self, node: Node) -> None:
        node.set(ctr=CTR_OK.replace("io.containerd.grpc.v1                     cri"
                                    "                      -              ok\n", ""))
        r = node.run("kubeadm", "init", "--config", self.cfg(node))
        assert preflight_errors(r) == [
            '[ERROR CRI]: container runtime is not running: validate service connection: CRI v1 '
            'runtime API is not implemented for endpoint "unix:///var/run/containerd/'
            'containerd.sock": rpc error: code = Unimplemented desc = unknown service '
            "runtime.v1.RuntimeService"]

    def test_cgroup_driver_mismatch(self, node: Node) -> None:
        node.set(systemd="false")
        r = node.run("kubeadm", "init", "--config", self.cfg(node))
        errs = preflight_errors(r)
        assert len(errs) == 1 and errs[0].startswith("[ERROR CgroupDriver]: the kubelet "
                                                      'cgroupDriver "systemd" does not match')

    def test_port_in_use_and_already_initialised(self, node: Node) -> None:
        port = free_port()
        s = socket.socket()
        s.bind(("0.0.0.0", port))
        s.listen()
        (node.root / "etc/kubernetes/manifests/kube-apiserver.yaml").write_text("x")
        (node.root / "var/lib/etcd/member").mkdir()
        try:
            r = node.run("kubeadm", "init", "--config",
                         self.cfg(node, INIT_CFG.format(port=port)))
        finally:
            s.close()
        assert preflight_errors(r) == [
            f"[ERROR Port-{port}]: Port {port} is in use",
            "[ERROR FileAvailable--etc-kubernetes-manifests-kube-apiserver.yaml]: "
            "/etc/kubernetes/manifests/kube-apiserver.yaml already exists",
            "[ERROR DirAvailable--var-lib-etcd]: /var/lib/etcd is not empty"]

    def test_kubelet_missing(self, node: Node) -> None:
        (node.bin / "kubelet").unlink()
        env_path = f"{node.bin}:/usr/bin:/bin"
        r = node.run("kubeadm", "init", "--config", self.cfg(node), PATH=env_path)
        assert any(e.startswith("[ERROR KubeletVersion]: couldn't get kubelet version")
                   for e in preflight_errors(r))

    @pytest.mark.parametrize("edit,needle", [
        (("v1beta4", "v1beta3"), 'no kind "InitConfiguration" is registered for version '
                                 '"kubeadm.k8s.io/v1beta3"'),
        (("  - name: feature-gates\n    value: DRAPartitionableDevices=true",
          "    feature-gates: DRAPartitionableDevices=true"),
         "json: cannot unmarshal object into Go struct field APIServer.apiServer.extraArgs of "
         "type []v1beta4.Arg"),
        (("ImageVolume", "Accelerators"), "unrecognized feature gate: Accelerators"),
        (("DRAPartitionableDevices=true", "Accelerators=true"),
         "unrecognized feature gate: Accelerators"),
    ])
    def test_init_refuses_config(self, node: Node, edit: tuple[str, str], needle: str) -> None:
        text = INIT_CFG.format(port=free_port()).replace(*edit)
        r = node.run("kubeadm", "init", "--config", self.cfg(node, text))
        assert r.returncode == 1
        assert needle in r.stderr
        assert not (node.root / "etc/kubernetes/pki/ca.crt").exists()


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


# ================================================================== end to end on one node
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


@pytest.fixture
def control_plane(node: Node) -> Iterator[tuple[Node, str]]:
    """kubeadm init on a temp root with the kubelet stand-in as a child process."""
    for port in (10248, 10250):
        for _ in range(50):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
                break
            except OSError:
                time.sleep(0.2)
            finally:
                s.close()
        else:
            pytest.skip(f"port {port} busy on this host")
    node.add_gpus(2)
    cfg = node.root / "_kubeadm.yaml"
    cfg.write_text(INIT_CFG.format(port=free_port()).replace(
        "  name: cp-01\n", "  name: cp-01\n  taints: []\n"))
    r = node.run("kubeadm", "init", "--config", str(cfg), "--skip-token-print")
    assert r.returncode == 0, r.stdout + r.stderr
    yield node, str(node.root / "etc/kubernetes/admin.conf")


def wait_for(fn: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.3)
    raise AssertionError("condition not reached")


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
        import re

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
        # on this host the pod cannot run (no containerd: tests/lab/test_real_pods.py runs it
        # in a lab node); the kubelet has given it one GPU and written the runner's spec
        uid = k("get", "pod", "gpu-smoke", "-o", "jsonpath={.metadata.uid}").stdout
        spec_file = node.root / f"run/gpuk8s-lab/pods/{uid}/spec.json"
        assert wait_for(lambda: spec_file.exists())
        spec = json.loads(spec_file.read_text())
        assert len(spec["gpus"]) == 1 and spec["gpus"][0].startswith("GPU-")
        assert spec["gpuRuntime"] is True
        assert spec["containers"][0]["command"] == ["nvidia-smi", "-L"]
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


class TestNodeLifecycleAndTools:
    def test_node_not_ready_when_kubelet_stops_posting(self, cluster: Cluster) -> None:
        cluster.add_node("gpu-01")
        node = cluster.client.get("/api/v1/nodes/gpu-01")
        node["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-01T00:00:00Z"
        cluster.client.request("PUT", "/api/v1/nodes/gpu-01/status", node)
        cluster.wait(lambda: "NotReady" in cluster.kubectl("get", "node", "gpu-01").stdout)
        n = cluster.client.get("/api/v1/nodes/gpu-01")
        ready = n["status"]["conditions"][0]
        assert (ready["status"], ready["message"]) == ("Unknown",
                                                       "Kubelet stopped posting node status.")
        assert {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"} in \
            n["spec"]["taints"]

    def test_cluster_info(self, cluster: Cluster) -> None:
        r = cluster.kubectl("cluster-info")
        assert r.stdout.splitlines()[0] == \
            f"Kubernetes control plane is running at {cluster.server}"

    def test_crictl(self, node: Node) -> None:
        """`crictl ps -a`, the command gpuk8s names when a control plane does not come back;
        crictl's other commands are not played."""
        r = node.run("crictl", "--runtime-endpoint", "unix:///run/containerd/containerd.sock",
                     "ps", "-a")
        # /run/containerd is not where the fake socket lives: crictl fails like the real one
        assert r.returncode == 1
        assert 'level=fatal msg="validate service connection: validate CRI v1 runtime API for ' \
            'endpoint \\"unix:///run/containerd/containerd.sock\\"' in r.stderr
        ep = "unix:///var/run/containerd/containerd.sock"
        r = node.run("crictl", "-r", ep, "ps", "-a")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split("\n")[0].split() == ["CONTAINER", "IMAGE", "CREATED", "STATE",
                                                   "NAME", "ATTEMPT", "POD", "ID", "POD"]
        for cmd in ("info", "version", "pods", "images"):
            r = node.run("crictl", "-r", ep, cmd)
            assert r.returncode == 1 and f"No help topic for '{cmd}'" in r.stderr
        node.set(ctr=CTR_OK.replace("io.containerd.grpc.v1                     cri"
                                    "                      -              ok\n", ""))
        r = node.run("crictl", "-r", ep, "ps", "-a")
        assert r.returncode == 1 and "unknown service runtime.v1.RuntimeService" in r.stderr


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
        assert out.splitlines() == ["configmap/shared"]  # streamed by b as a wrote it
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


def test_apiserver_refuses_unknown_feature_gate(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "k8s.apiserver", "--feature-gates=Accelerators=true",
                        ], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(STANDINS)}, timeout=30)
    assert r.returncode == 1
    assert r.stderr.strip() == ('Error: invalid argument "Accelerators=true" for '
                                '"--feature-gates" flag: unrecognized feature gate: Accelerators')


# ================================================================== the REAL kubectl's view
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


def kubectl_ok(cluster: Cluster, *args: str, stdin: str | None = None) -> str:
    r = cluster.kubectl(*args, stdin=stdin)
    assert r.returncode == 0, (args, r.stderr)
    return r.stdout


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
        row = kubectl_ok(cluster, "get", "clusterroles").splitlines()
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


def test_every_standin_module_is_in_every_package_that_ships_the_standins() -> None:
    """A module left out of a package definition breaks every node at the first import."""
    modules = {p.name for p in K8S.glob("*.py")}
    pkgs = Path(__file__).resolve().parents[2] / "packages" / "k8s"
    for d in sorted(pkgs.glob("*.yaml")):
        text = d.read_text()
        if "standins/k8s/__init__.py" not in text:
            continue
        shipped = set(re.findall(r"standins/k8s/(\w+\.py)", text))
        assert shipped == modules, (d.name, modules ^ shipped)


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


def test_kubelet_trims_logs_as_kubectl_asks() -> None:
    from k8s.kubelet import _trim_log

    log = "one\ntwo\nthree\n"
    assert _trim_log(log, {"tailLines": ["2"]}) == "two\nthree\n"
    assert _trim_log(log, {"tailLines": ["0"]}) == ""
    assert _trim_log(log, {"tailLines": ["-1"]}) == log  # kubectl's default: everything
    assert _trim_log(log, {"limitBytes": ["5"]}) == "one\nt"
    assert _trim_log(log, {}) == log


DRA_OBJECTS = """\
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.nvidia.com}
spec:
  selectors:
  - cel:
      expression: "device.driver == 'gpu.nvidia.com' && \\
        device.attributes['gpu.nvidia.com'].type == 'gpu'"
""" + "".join(f"""---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {{name: 00000-gpu.nvidia.com-{node}-abcde}}
spec:
  driver: gpu.nvidia.com
  nodeName: {node}
  pool: {{name: {node}, generation: 1, resourceSliceCount: 1}}
  devices:
""" + "".join(f"""  - name: gpu-{i}
    attributes:
      type: {{string: gpu}}
      uuid: {{string: GPU-{node}-{i}}}
    capacity:
      memory: {{value: 81559Mi}}
""" for i in range(n)) for node, n in (("gpu-01", 2), ("gpu-02", 1))) + "".join(f"""---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: train-gpus-{n}, namespace: default}}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly: {{deviceClassName: gpu.nvidia.com, allocationMode: ExactCount, count: {n}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: train-{n}, namespace: default}}
spec:
  restartPolicy: Never
  resourceClaims:
  - {{name: gpus-cuda, resourceClaimTemplateName: train-gpus-{n}}}
  containers:
  - name: cuda
    image: nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04
    resources:
      claims: [{{name: gpus-cuda}}]
""" for n in (1, 3))


def test_dynamic_resource_allocation_through_the_real_kubectl(cluster: Cluster) -> None:
    """resource.k8s.io/v1 (served from 1.34): discovery, NVIDIA's DeviceClass, two nodes'
    ResourceSlices, ResourceClaimTemplates as gpuk8s writes them; the 1-GPU pod gets a claim
    made from its template, allocated on a GPU node and reserved; the 3-GPU pod stays Pending
    with the scheduler's real message; an invalid template is the real 422."""
    cluster.add_node("cp-01", taints=[CP_TAINT])
    for name in ("gpu-01", "gpu-02", "cpu-01"):
        cluster.add_node(name)
    assert kubectl_ok(cluster, "api-resources", "--api-group=resource.k8s.io", "-o",
                      "name").split() == [
        "deviceclasses.resource.k8s.io", "resourceclaims.resource.k8s.io",
        "resourceclaimtemplates.resource.k8s.io", "resourceslices.resource.k8s.io"]
    kubectl_ok(cluster, "apply", "--server-side", "--field-manager=gpuk8s", "-f", "-",
               stdin=DRA_OBJECTS)

    def claim_of(pod: str) -> Obj | None:
        p = cluster.client.get(f"/api/v1/namespaces/default/pods/{pod}")
        st = (p.get("status", {}).get("resourceClaimStatuses") or [{}])[0]
        if not st.get("resourceClaimName"):
            return None
        c: Obj = cluster.client.get("/apis/resource.k8s.io/v1/namespaces/default/"
                                    f"resourceclaims/{st['resourceClaimName']}")
        return c

    one = cluster.wait(lambda: (c := claim_of("train-1")) and c.get("status", {}).get(
        "allocation") and c)
    assert re.fullmatch(r"train-1-gpus-cuda-[bcdfghjklmnpqrstvwxz2456789]{5}",
                        one["metadata"]["name"])
    assert one["metadata"]["annotations"] == {
        "resource.kubernetes.io/pod-claim-name": "gpus-cuda"}
    pod = cluster.client.get("/api/v1/namespaces/default/pods/train-1")
    assert one["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    node = pod["spec"]["nodeName"]
    assert node in ("gpu-01", "gpu-02")
    (result,) = one["status"]["allocation"]["devices"]["results"]
    assert result == {"request": "gpus", "driver": "gpu.nvidia.com", "pool": node,
                      "device": "gpu-0"}
    assert one["status"]["reservedFor"] == [
        {"resource": "pods", "name": "train-1", "uid": pod["metadata"]["uid"]}]
    rows = kubectl_ok(cluster, "get", "resourceclaims").splitlines()
    assert rows[0].split() == ["NAME", "STATE", "AGE"]
    assert rows[1].split()[:2] == [one["metadata"]["name"], "allocated,reserved"]
    assert kubectl_ok(cluster, "get", "resourceslices").splitlines()[0].split() == \
        ["NAME", "NODE", "DRIVER", "POOL", "AGE"]
    assert kubectl_ok(cluster, "get", "resourceslices", "--field-selector",
                      "spec.nodeName=gpu-02", "-o", "name") == \
        "resourceslice.resource.k8s.io/00000-gpu.nvidia.com-gpu-02-abcde\n"

    want = ("0/4 nodes are available: 1 node(s) had untolerated taint(s), 3 cannot allocate all "
            "claims. still not schedulable, preemption: 0/4 nodes are available: 4 Preemption is "
            "not helpful for scheduling.")
    big = cluster.wait(lambda: next((c for c in cluster.client.get(
        "/api/v1/namespaces/default/pods/train-3").get("status", {}).get("conditions") or []
        if c["type"] == "PodScheduled" and c.get("message") == want), None))
    assert (big["status"], big["reason"]) == ("False", "Unschedulable")
    out = kubectl_ok(cluster, "describe", "pod", "train-3")
    assert "Warning  FailedScheduling" in out and out.rstrip().endswith(want), out
    pending = claim_of("train-3")
    assert pending is not None and "allocation" not in pending.get("status", {})
    assert f"{pending['metadata']['name']}   pending" in kubectl_ok(
        cluster, "get", "resourceclaims")

    r = cluster.kubectl("apply", "--server-side", "--field-manager=gpuk8s", "-f", "-", stdin="""\
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: bad, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly: {allocationMode: ExactCount, count: -1}
""")
    assert r.returncode == 1
    assert "spec.spec.devices.requests[0].exactly.deviceClassName: Required value" in r.stderr
    assert "spec.spec.devices.requests[0].exactly.count: Invalid value: -1: must be greater " \
        "than zero" in r.stderr, r.stderr

    # the pod is deleted: its claim goes with it, and its GPU is free for another pod
    kubectl_ok(cluster, "delete", "pod", "train-1")
    cluster.wait(lambda: not cluster.client.get(
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims").get("items") or all(
        c["metadata"]["name"] != one["metadata"]["name"] for c in cluster.client.get(
            "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims")["items"]))


def test_dra_driver_on_a_kubelet(control_plane: tuple[Node, str]) -> None:
    """gpuk8s' own DRA manifest (templates/gpu/nvidia-dra-driver.yaml.j2) on a kubelet stand-in
    with the REAL nvidia-smi stand-in: the emulated kubelet plugin publishes the node's two
    H100s, a pod's 1-GPU claim is allocated and prepared (the runner's spec gives the pod that
    GPU through CDI, with the runc handler), a 3-GPU claim stays Pending."""
    import jinja2

    node, kc = control_plane
    k = lambda *a, **kw: node.run("kubectl", "--kubeconfig", kc, *a, **kw)  # noqa: E731
    (node.bin / "nvidia-smi").write_text(
        f"#!/bin/sh\nexec {sys.executable} {STANDINS / 'nvidia/nvidia-smi'} \"$@\"\n")
    (node.root / "run/nvidia-lab").mkdir(parents=True)
    (node.root / "run/nvidia-lab/loaded-module-version").write_text("580.159.04\n")
    assert k("apply", "--server-side", "-f", "-", stdin=FLANNEL).returncode == 0
    assert k("label", "node", "cp-01", "nvidia.com/gpu.present=true").returncode == 0
    manifest = jinja2.Template((Path(__file__).resolve().parents[4] / "templates/gpu/"
                                "nvidia-dra-driver.yaml.j2").read_text()).render(
        nvidia_dra_driver_version="0.4.0")
    r = k("apply", "--server-side", "--field-manager=gpuk8s", "-f", "-", stdin=manifest)
    assert r.returncode == 0, r.stderr
    uuids = subprocess.run([str(node.bin / "nvidia-smi"), "--query-gpu=uuid",
                            "--format=csv,noheader"], capture_output=True, text=True,
                           env=node.env()).stdout.split()
    assert len(uuids) == 2
    path = ('jsonpath={range .items[?(@.spec.nodeName=="cp-01")]}{.spec.driver}{" "}'
            '{range .spec.devices[*]}{.attributes.type.string}{" "}{end}{"\\n"}{end}')
    assert wait_for(lambda: k("get", "resourceslices", "-o", path).stdout ==
                    "gpu.nvidia.com gpu gpu \n")
    (sl,) = json.loads(k("get", "resourceslices", "-o", "json").stdout)["items"]
    assert re.fullmatch(r"00000-gpu\.nvidia\.com-cp-01-[a-z0-9]{5}", sl["metadata"]["name"])
    assert [d["attributes"]["uuid"]["string"] for d in sl["spec"]["devices"]] == uuids
    assert sl["spec"]["devices"][0]["capacity"] == {"memory": {"value": "81559Mi"}}
    r = k("apply", "--server-side", "-f", "-", stdin="".join(f"""---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: w-gpus-{n}, namespace: default}}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly: {{deviceClassName: gpu.nvidia.com, allocationMode: ExactCount, count: {n}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: w-{n}, namespace: default}}
spec:
  restartPolicy: Never
  resourceClaims: [{{name: gpus-smi, resourceClaimTemplateName: w-gpus-{n}}}]
  containers:
  - name: smi
    image: nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04
    command: [nvidia-smi, -L]
    resources: {{claims: [{{name: gpus-smi}}]}}
""" for n in (1, 3)))
    assert r.returncode == 0, r.stderr
    uid = k("get", "pod", "w-1", "-o", "jsonpath={.metadata.uid}").stdout
    spec_file = node.root / f"run/gpuk8s-lab/pods/{uid}/spec.json"
    assert wait_for(lambda: spec_file.exists())
    spec = json.loads(spec_file.read_text())
    assert spec["gpus"] == [uuids[0]] and spec["gpuRuntime"] is True and spec["cdi"] is True
    assert k("get", "resourceclaims").stdout.count("allocated,reserved") == 1
    assert wait_for(lambda: "1 cannot allocate all claims. still not schedulable, preemption: "
                    "0/1 nodes are available: 1 Preemption is not helpful for scheduling." in k(
                        "get", "pod", "w-3", "-o",
                        "jsonpath={.status.conditions[0].message}").stdout)
