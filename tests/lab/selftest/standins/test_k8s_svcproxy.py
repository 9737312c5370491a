"""The REAL kubectl through the API server stand-in's service proxy, on this machine (no lab
nodes: an API server stand-in with its own REAL etcd, as the test_k8s_*.py modules run it): what
gpuk8s runs on the first control plane to ask Prometheus, `kubectl get --raw
/api/v1/namespaces/NS/services/http:NAME:PORT/proxy/...`, reaches a pod's server and prints its
answer; the failures print the real API server's messages."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lab.selftest.standins.k8s_helpers import Cluster, free_port

NS = "gpuk8s-monitoring"
PROXY = f"/api/v1/namespaces/{NS}/services/http:prometheus:9090/proxy"


class Prometheus(http.server.BaseHTTPRequestHandler):
    """Answers an instant query as Prometheus' HTTP API does."""

    def log_message(self, *a: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "node": "gpu-01", "gpu": "0"},
             "value": [1700000000.0, "37"]}]}, "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "cluster")
    yield c
    c.stop()


@pytest.fixture
def backend() -> Iterator[int]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Prometheus)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield int(srv.server_address[1])
    srv.shutdown()
    srv.server_close()


def deploy(cluster: Cluster, target_port: int, ready: bool = True) -> None:
    """The monitoring Service and a Running pod behind it at 127.0.0.1 (its status written as
    the kubelet writes it)."""
    c = cluster.client
    if not any(n["metadata"]["name"] == "cp-01" for n in c.get("/api/v1/nodes")["items"]):
        cluster.add_node("cp-01")  # a pod on no node is removed by the pod GC
    if not any(n["metadata"]["name"] == NS for n in c.get("/api/v1/namespaces")["items"]):
        c.request("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
    c.request("POST", f"/api/v1/namespaces/{NS}/services", {
        "metadata": {"name": "prometheus"},
        "spec": {"selector": {"app.kubernetes.io/name": "prometheus"},
                 "ports": [{"name": "web", "port": 9090, "targetPort": target_port}]}})
    c.request("POST", f"/api/v1/namespaces/{NS}/pods", {
        "metadata": {"name": "prometheus-0", "labels": {"app.kubernetes.io/name": "prometheus"}},
        "spec": {"nodeName": "cp-01", "containers": [{"name": "prometheus", "image": "x"}]}})
    pod = c.get(f"/api/v1/namespaces/{NS}/pods/prometheus-0")
    pod["status"] = {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
                     "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    c.request("PUT", f"/api/v1/namespaces/{NS}/pods/prometheus-0/status", pod)


def test_kubectl_get_raw_reaches_prometheus(cluster: Cluster, backend: int) -> None:
    deploy(cluster, backend)
    url = f"{PROXY}/api/v1/query?query=avg+by+%28node%29+%28DCGM_FI_DEV_GPU_UTIL%29"
    r = cluster.kubectl("get", "--raw", url)
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    assert body["status"] == "success" and body["data"]["result"][0]["value"][1] == "37"
    assert body["path"] == "/api/v1/query?query=avg+by+%28node%29+%28DCGM_FI_DEV_GPU_UTIL%29"


def test_kubectl_prints_the_real_proxy_errors(cluster: Cluster) -> None:
    r = cluster.kubectl("get", "--raw", f"{PROXY}/api/v1/query?query=up")
    assert r.returncode == 1
    assert r.stderr.strip() == 'Error from server (NotFound): services "prometheus" not found'
    closed = free_port()  # nothing listens there
    deploy(cluster, closed)
    r = cluster.kubectl("get", "--raw", f"{PROXY}/api/v1/query?query=up")
    assert r.stderr.strip() == (
        "Error from server (ServiceUnavailable): error trying to reach service: dial tcp "
        f"127.0.0.1:{closed}: connect: connection refused"), r.stderr
    r = cluster.kubectl("get", "--raw", f"/api/v1/namespaces/{NS}/services/prometheus:9091/"
                        "proxy/")
    assert r.stderr.strip() == ('Error from server (ServiceUnavailable): no service port 9091 '
                                'found for service "prometheus"'), r.stderr
