# LAB STAND-IN: not the real client-go. Test infrastructure for gpuk8s; never shipped to users.
"""A small HTTPS client for the stand-in API server (client certs or bearer tokens)."""

from __future__ import annotations

import http.client
import json
import os
import ssl
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

from .kubeconfig import Creds


class ApiError(Exception):
    def __init__(self, code: int, body: dict[str, Any]) -> None:
        super().__init__(body.get("message", f"HTTP {code}"))
        self.code = code
        self.body = body

    @property
    def reason(self) -> str:
        return str(self.body.get("reason", ""))


class Unreachable(Exception):
    """Connection refused / no route: kubectl's 'The connection to the server ... was refused'."""

    def __init__(self, hostport: str, detail: str, refused: bool) -> None:
        super().__init__(detail)
        self.hostport = hostport
        self.refused = refused


class TLSError(Exception):
    pass


#: seconds an idle connection is reused (the stand-in API server closes one idle for 30 s)
IDLE_REUSE = 15
#: what a kept-alive connection the server has since closed raises on its next request
_STALE = (ConnectionResetError, BrokenPipeError, ssl.SSLError, http.client.RemoteDisconnected,
          http.client.BadStatusLine)


def ssl_context(creds: Creds) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if creds.insecure or not creds.ca_pem:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx.load_verify_locations(cadata=creds.ca_pem)
    if creds.cert_pem and creds.key_pem:
        with tempfile.TemporaryDirectory() as td:
            c, k = os.path.join(td, "c.pem"), os.path.join(td, "k.pem")
            with open(c, "w") as f:
                f.write(creds.cert_pem)
            with open(k, "w") as f:
                f.write(creds.key_pem)
            ctx.load_cert_chain(c, k)
    return ctx


class Client:
    def __init__(self, creds: Creds, timeout: float = 30, agent: str = "lab-standin",
                 retry_for: float = 0, keep_alive: bool = False) -> None:
        self.creds = creds
        #: seconds to keep retrying a request that found no API server (every 0.5 s), as
        #: kubeadm retries its API calls for timeouts.kubernetesAPICall (1m)
        self.retry_for = retry_for
        self.agent = f"{agent}/v0.0.0 (linux/amd64) gpuk8s-lab"
        u = urllib.parse.urlsplit(creds.server)
        self.host = u.hostname or "localhost"
        self.port = u.port or 443
        self.hostport = f"{self.host}:{self.port}"
        self.timeout = timeout
        self.ctx = ssl_context(creds)
        # keep_alive: one kept-alive connection per thread, as client-go reuses its
        # connections; the kubelet's own client and its emulated daemons' (flanneld, kube-proxy,
        # DNS) use it (a mutual-TLS handshake per request cost the lab's idle kubelets and API
        # server more CPU than the requests themselves). Off
        # for the rest: kubeadm's stand-in waits for the new API server by asking /version
        # through the control-plane endpoint, and a kept-alive connection through a TCP load
        # balancer stays with the old server it first reached
        self.keep_alive = keep_alive
        self._local = threading.local()

    def _connection(self) -> tuple[http.client.HTTPSConnection, bool]:
        """This thread's open connection, or a new one; True when it is reused."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and time.monotonic() - self._local.used < IDLE_REUSE:
            return conn, True
        self._drop()
        conn = self._local.conn = http.client.HTTPSConnection(
            self.host, self.port, context=self.ctx, timeout=self.timeout)
        return conn, False

    def _drop(self) -> None:
        conn, self._local.conn = getattr(self._local, "conn", None), None
        if conn is not None:
            conn.close()

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json", raw: bool = False) -> Any:
        deadline = time.monotonic() + self.retry_for
        while True:
            try:
                return self._request(method, path, body, content_type, raw)
            except Unreachable:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)

    def _request(self, method: str, path: str, body: Any, content_type: str,
                 raw: bool) -> Any:
        data: bytes | None = None
        if method == "PUT" and isinstance(body, dict) and body.get("metadata"):
            # the stand-ins update unconditionally (no resourceVersion: no 409 Conflict), as
            # the real components would after retrying on a conflict
            body = {**body, "metadata": {k: v for k, v in body["metadata"].items()
                                         if k != "resourceVersion"}}
        if body is not None:
            data = body if isinstance(body, bytes) else (
                body.encode() if isinstance(body, str) else json.dumps(body).encode())
        headers = self._headers()
        if data is not None:
            headers["Content-Type"] = content_type
        while True:
            conn, reused = self._connection()
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
            except (OSError, http.client.HTTPException) as e:
                self._drop()
                if reused and isinstance(e, _STALE) and \
                        not isinstance(e, ssl.SSLCertVerificationError):
                    continue  # the server closed it while idle (or restarted): a new one
                if isinstance(e, ssl.SSLCertVerificationError):
                    raise TLSError(f"tls: failed to verify certificate: {e.verify_message}"
                                   ) from e
                if isinstance(e, ConnectionRefusedError):
                    raise Unreachable(self.hostport, str(e), True) from e
                if isinstance(e, OSError):
                    raise Unreachable(self.hostport, str(e), False) from e
                raise
            if resp.will_close or not self.keep_alive:
                self._drop()
            else:
                self._local.used = time.monotonic()
            break
        if resp.status >= 400:
            try:
                err = json.loads(payload)
            except ValueError:
                err = {"message": payload.decode(errors="replace"), "code": resp.status}
            raise ApiError(resp.status, err)
        if raw:
            return payload
        return json.loads(payload) if payload else {}

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def _headers(self) -> dict[str, str]:
        """What every request of this client carries: JSON, its agent, its token if any."""
        headers = {"Accept": "application/json", "User-Agent": self.agent}
        if self.creds.token:
            headers["Authorization"] = f"Bearer {self.creds.token}"
        return headers

    def stream(self, path: str, idle: float) -> Iterator[bytes]:
        """The lines of a watch ``path`` (one event each), on a connection of its own; ends
        when the server ends the stream, raises Unreachable when the connection breaks or
        stays silent for ``idle`` seconds."""
        conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx,
                                           timeout=idle)
        try:
            conn.request("GET", path, headers=self._headers())
            resp = conn.getresponse()
            if resp.status >= 400:
                raise ApiError(resp.status, {"message": resp.read().decode(errors="replace"),
                                             "code": resp.status})
            while line := resp.readline():
                yield line
        except (OSError, http.client.HTTPException) as e:
            raise Unreachable(self.hostport, str(e), isinstance(e, ConnectionRefusedError)
                              ) from e
        finally:
            conn.close()


def follow(client: Client, path: str, seconds: int, changed: threading.Event) -> None:
    """An informer's watch, forever: open the watch ``path`` (its ``timeoutSeconds`` is
    ``seconds``) and set ``changed`` on each event, the opening ADDED events included; open it
    again when the server ends it, and a second later when the API server is away
    (restarting, not started yet)."""
    while True:
        opened = time.monotonic()
        try:
            for _ in client.stream(path, idle=seconds + 30):
                changed.set()
        except (ApiError, Unreachable, TLSError, OSError):
            pass
        if time.monotonic() - opened < 5:
            time.sleep(1)
