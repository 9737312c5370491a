"""The service proxy of the lab's API server stand-in (tests/lab/standins/k8s/svcproxy.py):
``/api/v1/namespaces/{ns}/services/{[scheme:]name[:port]}/proxy/{path}`` resolved and answered
as kube-apiserver does (ResourceLocation's port and endpoint rules, its error texts), against
real HTTP servers on this host, and through the API server's own dispatch."""

from __future__ import annotations

import http.server
import json
import random
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any, cast

import pytest

from tests.lab.standins.k8s import svcproxy
from tests.lab.standins.k8s.apiserver import ApiServer, HTTPError
from tests.lab.standins.k8s.resources import Registry

NS = "gpuk8s-monitoring"
READY = [{"type": "Ready", "status": "True"}]


def service(ports: list[dict[str, Any]], selector: dict[str, str] | None = None,
            name: str = "prometheus") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS},
            "spec": {"selector": {"app.kubernetes.io/name": "prometheus"}
                     if selector is None else selector, "ports": ports}}


def pod(name: str, ip: str | None, ready: bool = True, phase: str = "Running",
        ports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS,
                         "labels": {"app.kubernetes.io/name": "prometheus"}},
            "spec": {"containers": [{"name": "prometheus", "ports": ports or []}]},
            "status": {"phase": phase, **({"podIP": ip} if ip else {}),
                       "conditions": READY if ready else []}}


def err(code: int, reason: str, message: str, details: dict[str, Any] | None = None
        ) -> HTTPError:
    return HTTPError(code, reason, message, details)


def fails(id_: str, svc: dict[str, Any] | None, pods: list[dict[str, Any]],
          eps: dict[str, Any] | None = None) -> tuple[int, str, str]:
    with pytest.raises(HTTPError) as e:
        svcproxy.resolve(id_, svc, pods, eps, err)
    return e.value.code, e.value.reason, e.value.message


# ---------------------------------------------------------------- resolution
def test_ids_split_as_kubernetes_splits_them() -> None:
    split = svcproxy.split_scheme_name_port
    assert split("prometheus") == ("", "prometheus", "")
    assert split("prometheus:9090") == ("", "prometheus", "9090")
    assert split("https:prometheus:web") == ("https", "prometheus", "web")
    assert split("ftp:prometheus:9090") is None
    assert split(":9090") is None and split("a:b:c:d") is None


def test_a_port_number_stands_for_the_service_ports_name() -> None:
    svc = service([{"name": "web", "port": 9090, "targetPort": 9090}])
    pods = [pod("p", "10.244.3.5")]
    assert svcproxy.resolve("http:prometheus:9090", svc, pods, None, err) == \
        ("http", "10.244.3.5", 9090)
    assert svcproxy.resolve("prometheus:web", svc, pods, None, err) == \
        ("http", "10.244.3.5", 9090)
    assert svcproxy.resolve("https:prometheus:9090", svc, pods, None, err)[0] == "https"
    # a named Service port is not the unnamed default: no port given finds no endpoint
    assert fails("prometheus", svc, pods) == (
        503, "ServiceUnavailable", 'no endpoints available for service "prometheus"')
    assert fails("prometheus:9091", svc, pods) == (
        503, "ServiceUnavailable", 'no service port 9091 found for service "prometheus"')
    assert fails("prometheus:metrics", svc, pods)[2] == \
        'no endpoints available for service "prometheus:metrics"'
    # one unnamed port: the bare name reaches it
    unnamed = service([{"port": 80, "targetPort": 9090}])
    assert svcproxy.resolve("prometheus", unnamed, pods, None, err) == \
        ("http", "10.244.3.5", 9090)


def test_named_target_ports_resolve_through_the_container_ports() -> None:
    svc = service([{"name": "web", "port": 80, "targetPort": "http-web"}])
    with_port = pod("p", "10.244.3.5", ports=[{"name": "http-web", "containerPort": 9090}])
    assert svcproxy.resolve("prometheus:80", svc, [with_port], None, err)[1:] == \
        ("10.244.3.5", 9090)
    # a pod without that port is no endpoint of the Service at all
    assert fails("prometheus:80", svc, [pod("q", "10.244.3.6")])[2] == \
        'no endpoints available for service "prometheus"'


def test_the_real_error_texts() -> None:
    svc = service([{"name": "web", "port": 9090}])
    assert fails("http:prometheus:9090", None, []) == (
        404, "NotFound", 'services "prometheus" not found')
    assert fails("prometheus:web", None, []) == (
        404, "NotFound", 'endpoints "prometheus" not found')
    assert fails("a:b:c:d", svc, []) == (400, "BadRequest", 'invalid service request "a:b:c:d"')
    # no pod selected, none with an IP, none still running: no subsets at all
    for pods in ([], [pod("p", None)], [pod("p", "10.244.3.5", phase="Failed")]):
        assert fails("http:prometheus:9090", svc, pods) == (
            503, "ServiceUnavailable", 'no endpoints available for service "prometheus"')
    # pods there but none ready: the message names the id
    assert fails("http:prometheus:9090", svc, [pod("p", "10.244.3.5", ready=False)]) == (
        503, "ServiceUnavailable", 'no endpoints available for service "http:prometheus:9090"')
    # a Service without a selector uses an Endpoints object of its own, if there is one
    bare = service([{"port": 80}], selector={})
    assert fails("prometheus", bare, [pod("p", "10.244.3.5")])[:2] == (404, "NotFound")
    eps = {"subsets": [{"addresses": [{"ip": "10.0.0.9"}], "ports": [{"port": 8080}]}]}
    assert svcproxy.resolve("prometheus", bare, [], eps, err) == ("http", "10.0.0.9", 8080)


def test_a_random_ready_endpoint() -> None:
    svc = service([{"port": 9090}])
    pods = [pod(f"p{i}", f"10.244.3.{i}") for i in range(1, 4)] + \
        [pod("slow", "10.244.3.9", ready=False)]
    got = {svcproxy.resolve("prometheus", svc, pods, None, err, random.Random(seed))[1]
           for seed in range(40)}
    assert got == {"10.244.3.1", "10.244.3.2", "10.244.3.3"}


# ---------------------------------------------------------------- forwarding
class Backend(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, dict[str, str]]] = []

    def log_message(self, *a: Any) -> None:
        pass

    def do_GET(self) -> None:
        Backend.seen.append((self.path, dict(self.headers.items())))
        if self.path.startswith("/api/v1/query?"):
            code, body = 200, json.dumps({"status": "success", "data": {
                "resultType": "vector", "result": []}})
        else:
            code, body = 400, json.dumps({"status": "error", "errorType": "bad_data"})
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def backend() -> Iterator[int]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Backend)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield int(srv.server_address[1])
    srv.shutdown()
    srv.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeStore:
    def __init__(self, objs: dict[tuple[str, str, str], dict[str, Any]]) -> None:
        self.objs = objs

    def get(self, key: tuple[str, str], ns: str, name: str) -> dict[str, Any] | None:
        return self.objs.get((key[1], ns, name))

    def catch_up(self, timeout: float = 10) -> None:
        """In memory: always caught up."""

    def list(self, key: tuple[str, str], ns: str | None,
             where: Callable[[dict[str, Any]], bool] | None = None) -> list[dict[str, Any]]:
        return [o for (plural, n, _), o in self.objs.items()
                if plural == key[1] and (ns is None or n == ns) and (where is None or where(o))]


class Request:
    """The parts of the API server's request handler that dispatch reads."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.headers = {"Host": "10.88.0.11:6443", "Accept": "application/json, */*",
                        "Authorization": "Bearer secret", "User-Agent": "kubectl/v1.36.4"}


def api_server(objs: dict[tuple[str, str, str], dict[str, Any]]) -> ApiServer:
    api = ApiServer.__new__(ApiServer)  # no etcd: a store of these objects
    api.registry = Registry()
    api.store = FakeStore(objs)  # type: ignore[assignment]
    api.lock = threading.RLock()
    return api


def proxy_get(api: ApiServer, path: str) -> tuple[int, Any, str]:
    """GET ``path`` (after /api/v1/namespaces/NS/services/) through ApiServer.dispatch."""
    id_, _, rest = path.partition("/")
    full = f"/api/v1/namespaces/{NS}/services/{path}"
    sub = "/".join(p for p in rest.split("?")[0].split("/") if p)
    h = cast(BaseHTTPRequestHandler, Request(full))
    return api.dispatch("GET", api.R("services"), NS, id_, sub, {}, b"", h, "admin")


def test_the_query_reaches_the_pod_and_its_answer_comes_back(backend: int) -> None:
    api = api_server({("services", NS, "prometheus"): service(
        [{"name": "web", "port": 9090, "targetPort": backend}]),
        ("pods", NS, "p"): pod("p", "127.0.0.1")})
    Backend.seen.clear()
    query = "query=avg+by+%28node%29+%28DCGM_FI_DEV_GPU_UTIL%29"
    code, body, ctype = proxy_get(api, f"http:prometheus:9090/proxy/api/v1/query?{query}")
    assert (code, ctype) == (200, "application/json")
    assert json.loads(body)["status"] == "success"
    path, headers = Backend.seen[-1]
    assert path == f"/api/v1/query?{query}"
    assert "Authorization" not in headers and headers["Accept"] == "application/json, */*"
    assert headers["X-Forwarded-Uri"] == \
        f"/api/v1/namespaces/{NS}/services/http:prometheus:9090/proxy/api/v1/query"
    assert (headers["X-Forwarded-Host"], headers["X-Forwarded-Proto"]) == \
        ("10.88.0.11:6443", "https")
    # the backend's own error status and body pass through
    code, body, _ = proxy_get(api, "prometheus:web/proxy/api/v1/nope")
    assert code == 400 and json.loads(body)["errorType"] == "bad_data"


def test_an_unreachable_backend_is_a_503_with_gos_dial_error() -> None:
    port = closed_port()
    api = api_server({("services", NS, "prometheus"): service(
        [{"name": "web", "port": 9090, "targetPort": port}]),
        ("pods", NS, "p"): pod("p", "127.0.0.1")})
    with pytest.raises(HTTPError) as e:
        proxy_get(api, "http:prometheus:9090/proxy/api/v1/query?query=up")
    assert e.value.status() == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": f"error trying to reach service: dial tcp 127.0.0.1:{port}: connect: "
                   "connection refused", "reason": "ServiceUnavailable", "details": {},
        "code": 503}


def test_https_to_a_plain_http_backend(backend: int) -> None:
    api = api_server({("services", NS, "prometheus"): service(
        [{"name": "web", "port": 9090, "targetPort": backend}]),
        ("pods", NS, "p"): pod("p", "127.0.0.1")})
    with pytest.raises(HTTPError) as e:
        proxy_get(api, "https:prometheus:9090/proxy/")
    assert (e.value.code, e.value.message) == (
        503, "error trying to reach service: tls: first record does not look like a TLS "
             "handshake")


def test_no_service_through_dispatch() -> None:
    with pytest.raises(HTTPError) as e:
        proxy_get(api_server({}), "http:prometheus:9090/proxy/api/v1/query")
    assert (e.value.code, e.value.reason, e.value.message, e.value.details) == (
        404, "NotFound", 'services "prometheus" not found',
        {"name": "prometheus", "kind": "services"})
