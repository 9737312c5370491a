# LAB STAND-IN: not the real kube-apiserver. Test infrastructure for gpuk8s; never shipped to users.
"""The API server's service proxy: ``/api/v1/namespaces/{ns}/services/{[scheme:]name[:port]}/
proxy/{path}?{query}``, as kube-apiserver serves it (pkg/registry/core/service: ResourceLocation,
ProxyREST; apimachinery's proxy Transport):

- the id is split as utilnet.SplitSchemeNamePort ("name", "name:port", "scheme:name:port",
  scheme "", "http" or "https"; anything else: 400 ``invalid service request "<id>"``);
- a port *number* is looked up among the Service's ports (404 ``services "<name>" not found``,
  503 ``no service port <n> found for service "<name>"``) and stands for that port's name;
- the Service's endpoints: the real server reads its Endpoints object (404 ``endpoints
  "<name>" not found`` when there is none: no such Service, or one without a selector and no
  Endpoints of its own); the stand-in has no endpoints controller, so a Service with a selector
  gets what the real one would write: the selected pods that have an IP and have not ended,
  ready ones as addresses, with the target port (a named one resolved through the pod's
  container ports) under the Service port's name. No subsets: 503 ``no endpoints available
  for service "<name>"``; none ready with the wanted port name: the same 503 with the id;
- the request goes to a random ready address over http (or https, certificates not
  verified), path and query passed on, X-Forwarded-Uri/-Host/-Proto added; the answer's
  status, body and Content-Type come back as they are (no rewriting of HTML links);
- an unreachable backend: 503 ``error trying to reach service: dial tcp <ip>:<port>:
  connect: connection refused`` (Go's net error texts).
"""

from __future__ import annotations

import errno as errno_
import http.client
import os
import random
import re
import socket
import ssl
from collections.abc import Callable, Sequence
from typing import Any

from .common import pod_ready, service_selects

Obj = dict[str, Any]
#: builds the API server's HTTPError(code, reason, message, details)
ErrorFactory = Callable[..., Exception]
PROXY_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/services/([^/]+)/proxy(/[^?]*)?")
DIAL_TIMEOUT = 30.0  # the proxy transport's dialer
#: request headers passed on (the API server's authentication filter drops Authorization)
FORWARDED = ("Accept", "Content-Type", "User-Agent", "Accept-Language")


def split_scheme_name_port(id_: str) -> tuple[str, str, str] | None:
    """utilnet.SplitSchemeNamePort: (scheme, name, port), or None when the id is invalid."""
    parts = id_.split(":")
    if len(parts) == 1:
        scheme, name, port = "", parts[0], ""
    elif len(parts) == 2:
        scheme, name, port = "", parts[0], parts[1]
    elif len(parts) == 3:
        scheme, name, port = parts
    else:
        return None
    if not name or scheme not in ("", "http", "https"):
        return None
    return scheme, name, port


def _target_port(pod: Obj, port: Obj) -> int | None:
    """The endpoints controller's podutil.FindPort: a number, or a named container port."""
    target = port.get("targetPort", port.get("port"))
    if isinstance(target, str) and not target.isdigit():
        for c in pod["spec"].get("containers") or []:
            for cp in c.get("ports") or []:
                if cp.get("name") == target and str(cp.get("protocol", "TCP")) == str(
                        port.get("protocol", "TCP")):
                    return int(cp["containerPort"])
        return None
    try:
        return int(str(target))
    except ValueError:
        return None


def subsets(svc: Obj, pods: Sequence[Obj]) -> list[Obj]:
    """The Endpoints subsets the endpoints controller would write for ``svc`` (with a
    selector): one per set of ports, ready pods under addresses, others under
    notReadyAddresses (all ready with publishNotReadyAddresses)."""
    spec = svc.get("spec") or {}
    selector = spec.get("selector") or {}
    ns = svc["metadata"].get("namespace")
    groups: dict[tuple[tuple[str, int], ...], Obj] = {}
    for p in pods:
        st = p.get("status") or {}
        if p["metadata"].get("namespace") != ns or not service_selects(selector, p) or \
                not st.get("podIP") or st.get("phase") in ("Succeeded", "Failed"):
            continue
        terminating = bool(p["metadata"].get("deletionTimestamp"))
        if terminating and not spec.get("publishNotReadyAddresses"):
            continue
        ports = []
        for sp in spec.get("ports") or []:
            n = _target_port(p, sp)
            if n is not None:
                ports.append((str(sp.get("name") or ""), n))
        if spec.get("ports") and not ports:  # no port of the Service found in the pod
            continue
        key = tuple(sorted(ports))
        sub = groups.setdefault(key, {"addresses": [], "notReadyAddresses": [],
                                      "ports": [{"name": k, "port": v} for k, v in key]})
        ready = spec.get("publishNotReadyAddresses") or (pod_ready(p) and not terminating)
        sub["addresses" if ready else "notReadyAddresses"].append(
            {"ip": st["podIP"], "targetRef": {"kind": "Pod", "name": p["metadata"]["name"],
                                              "namespace": ns}})
    return list(groups.values())


def resolve(id_: str, svc: Obj | None, pods: Sequence[Obj], endpoints: Obj | None,
            error: ErrorFactory, rng: random.Random | None = None) -> tuple[str, str, int]:
    """ResourceLocation: (scheme, ip, port) of one ready endpoint of the Service ``id_``."""
    split = split_scheme_name_port(id_)
    if split is None:
        raise error(400, "BadRequest", f'invalid service request "{id_}"')
    scheme, name, port_str = split
    if re.fullmatch(r"[+-]?[0-9]+", port_str):  # strconv.ParseInt succeeds
        if svc is None:
            raise error(404, "NotFound", f'services "{name}" not found',
                        {"name": name, "kind": "services"})
        num = int(port_str)
        match = next((p for p in (svc.get("spec") or {}).get("ports") or []
                      if int(p.get("port", -1)) == num), None)
        if match is None:
            raise error(503, "ServiceUnavailable",
                        f'no service port {num} found for service "{name}"')
        port_str = str(match.get("name") or "")
    if svc is not None and (svc.get("spec") or {}).get("selector"):
        subs = subsets(svc, pods)
    elif endpoints is not None:
        subs = list(endpoints.get("subsets") or [])
    else:
        raise error(404, "NotFound", f'endpoints "{name}" not found',
                    {"name": name, "kind": "endpoints"})
    if not subs:
        raise error(503, "ServiceUnavailable", f'no endpoints available for service "{name}"')
    rng = rng or random.Random()
    for sub in rng.sample(subs, len(subs)):
        addresses = sub.get("addresses") or []
        for p in sub.get("ports") or []:
            if str(p.get("name") or "") == port_str and addresses:
                ip = str(rng.choice(addresses).get("ip", ""))
                return scheme or "http", ip, int(p["port"])
    raise error(503, "ServiceUnavailable", f'no endpoints available for service "{id_}"')


def dial_error(ip: str, port: int, exc: BaseException) -> str:
    """Go's net error text for a failed dial."""
    if isinstance(exc, TimeoutError | socket.timeout):
        return f"dial tcp {ip}:{port}: i/o timeout"
    code = getattr(exc, "errno", None)
    text = os.strerror(code).lower() if code else str(exc)
    if code == errno_.ECONNREFUSED:
        text = "connection refused"
    return f"dial tcp {ip}:{port}: connect: {text}"


def forward(scheme: str, ip: str, port: int, path: str, query: str, method: str,
            body: bytes, headers: dict[str, str], prefix: str, api_host: str,
            error: ErrorFactory) -> tuple[int, bytes, str]:
    """The request to the endpoint; (status, body, content type) of its answer."""
    conn: http.client.HTTPConnection
    if scheme == "https":
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        conn = http.client.HTTPSConnection(ip, port, timeout=DIAL_TIMEOUT, context=ctx)
    else:
        conn = http.client.HTTPConnection(ip, port, timeout=DIAL_TIMEOUT)
    target = (path or "/") + (f"?{query}" if query else "")
    sent = {k: v for k, v in headers.items() if k in FORWARDED}
    sent.update({"X-Forwarded-Uri": prefix + (path or "") or "/", "X-Forwarded-Host": api_host,
                 "X-Forwarded-Proto": "https"})
    try:
        try:
            conn.connect()
        except ssl.SSLError as e:
            reason = "tls: first record does not look like a TLS handshake" \
                if "WRONG_VERSION_NUMBER" in str(e) else f"tls: {e.reason or e}"
            raise error(503, "ServiceUnavailable",
                        f"error trying to reach service: {reason}") from e
        except OSError as e:
            raise error(503, "ServiceUnavailable",
                        f"error trying to reach service: {dial_error(ip, port, e)}") from e
        try:
            conn.request(method, target, body=body or None, headers=sent)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise error(503, "ServiceUnavailable", "error trying to reach service: "
                        f"{'EOF' if isinstance(e, http.client.RemoteDisconnected) else e}"
                        ) from e
        return resp.status, data, resp.getheader("Content-Type") or \
            "text/plain; charset=utf-8"
    finally:
        conn.close()


def serve(api: Any, ns: str, id_: str, raw_path: str, method: str, body: bytes,
          headers: dict[str, str], error: ErrorFactory) -> tuple[int, bytes, str]:
    """GET (or any method) on services/{id}/proxy/...: ``api`` is the ApiServer (its get, list
    and R), ``raw_path`` the request's path and query as the client sent them."""
    path_part, _, query = raw_path.partition("?")
    m = PROXY_PATH.match(path_part)
    rest = (m.group(3) or "") if m else ""
    split = split_scheme_name_port(id_)
    svc = eps = None
    pods: list[Obj] = []
    if split is not None:
        svc = api.get(api.R("services"), ns, split[1])
        if svc is not None and (svc.get("spec") or {}).get("selector"):
            pods = api.list(api.R("pods"), ns)
        else:  # no Service, or one without a selector: only an Endpoints object of its own
            eps = api.get(api.R("endpoints"), ns, split[1])
    scheme, ip, port = resolve(id_, svc, pods, eps, error)
    prefix = path_part[:len(path_part) - len(rest)] if m else path_part
    return forward(scheme, ip, port, rest, query, method, body, headers, prefix,
                   headers.get("Host", ""), error)
