"""The lab's emulated pod network, its pure parts: flannel's CNI delegate, kube-proxy's rules,
the cluster DNS and a pod spec's env and volumes."""

from __future__ import annotations

import base64
import json
import socket
import struct
from pathlib import Path

import pytest
from k8s import dns, flannel_cni, proxy, realpods

from tests.lab.selftest.standins.k8s_helpers import NEEDS_OPENSSL, Obj

pytestmark = NEEDS_OPENSSL


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
                if path == "/api/v1/services":   # the kubelet's Service informer
                    return {"items": [{"metadata": {"name": "kubernetes",
                                                    "namespace": "default"},
                                       "spec": {"clusterIP": "10.96.0.1", "ports": [
                                           {"name": "https", "port": 443}]}}]}
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
        assert c["env"] == {
            "T": "s3cret", "I": "1", "KUBERNETES_SERVICE_HOST": "10.96.0.1",
            "KUBERNETES_SERVICE_PORT": "443", "KUBERNETES_SERVICE_PORT_HTTPS": "443",
            "KUBERNETES_PORT": "tcp://10.96.0.1:443",
            "KUBERNETES_PORT_443_TCP": "tcp://10.96.0.1:443",
            "KUBERNETES_PORT_443_TCP_PROTO": "tcp", "KUBERNETES_PORT_443_TCP_PORT": "443",
            "KUBERNETES_PORT_443_TCP_ADDR": "10.96.0.1"}
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
