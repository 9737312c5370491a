# LAB STAND-IN: not CoreDNS. Test infrastructure for gpuk8s; never shipped to users.
"""The cluster DNS, EMULATED: the lab has no CoreDNS image, so each node's kubelet stand-in
answers at the cluster DNS address (kubelet config clusterDNS, bound on the node's loopback
as NodeLocal DNSCache binds it) from the API server, with the records of Kubernetes' DNS
specification that the workloads use: A records of Services (`svc.ns.svc.<domain>`: the
ClusterIP, or the ready endpoints' pod IPs of a headless Service), of pods named by
hostname and subdomain (`host.svc.ns.svc.<domain>`) and of `a-b-c-d.ns.pod.<domain>`.
Other names inside the domain are NXDOMAIN; names outside it are refused (the lab has no
upstream resolver)."""

from __future__ import annotations

import socket
import struct
import threading
from typing import Any

from .client import ApiError, Client
from .common import pod_ready, service_selects

Obj = dict[str, Any]
NOERROR, SERVFAIL, NXDOMAIN, REFUSED = 0, 2, 3, 5
TYPE_A, TYPE_AAAA = 1, 28
TTL = 5


def parse_question(packet: bytes) -> tuple[int, int, str, int, int]:
    """(id, flags, name, qtype, end of the question) of a query with one question."""
    qid, flags, qdcount = struct.unpack("!HHH", packet[:6])
    if qdcount != 1:
        raise ValueError("one question per query")
    labels, pos = [], 12
    while packet[pos]:
        n = packet[pos]
        if n & 0xC0:
            raise ValueError("compressed question")
        labels.append(packet[pos + 1:pos + 1 + n].decode("ascii", "replace"))
        pos += 1 + n
    qtype, _qclass = struct.unpack("!HH", packet[pos + 1:pos + 5])
    return qid, flags, ".".join(labels).lower(), qtype, pos + 5


def answer(packet: bytes, rcode: int, ips: list[str]) -> bytes:
    qid, flags, _, qtype, end = parse_question(packet)
    records = [ip for ip in ips if qtype == TYPE_A]
    head = struct.pack("!HHHHHH", qid, 0x8400 | (flags & 0x0100) | 0x0080 | rcode, 1,
                       len(records), 0, 0)
    body = b"".join(struct.pack("!HHHIH", 0xC00C, TYPE_A, 1, TTL, 4) +
                    socket.inet_aton(ip) for ip in records)
    return head + packet[12:end] + body


class ClusterDNS:
    def __init__(self, client: Client, domain: str) -> None:
        self.client = client
        self.domain = domain.strip(".").lower()

    def _get(self, path: str) -> Obj | None:
        try:
            return self.client.get(path)
        except ApiError:
            return None

    def resolve(self, name: str) -> tuple[int, list[str]]:
        """(rcode, A records) for ``name`` (lower case, no trailing dot)."""
        suffix = "." + self.domain
        if not name.endswith(suffix):
            return REFUSED, []
        parts = name[:-len(suffix)].split(".")
        if len(parts) == 3 and parts[2] == "pod":
            ip = parts[0].replace("-", ".")
            try:
                socket.inet_aton(ip)
            except OSError:
                return NXDOMAIN, []
            return NOERROR, [ip]
        if len(parts) not in (3, 4) or parts[-1] != "svc":
            return NXDOMAIN, []
        ns, service = parts[-2], parts[-3]
        svc = self._get(f"/api/v1/namespaces/{ns}/services/{service}")
        if svc is None:
            return NXDOMAIN, []
        spec = svc.get("spec", {})
        pods = (self._get(f"/api/v1/namespaces/{ns}/pods") or {}).get("items", [])
        not_ready_ok = bool(spec.get("publishNotReadyAddresses"))
        members = [p for p in pods if service_selects(spec.get("selector") or {}, p)
                   and p.get("status", {}).get("podIP")
                   and p.get("status", {}).get("phase") in ("Pending", "Running")
                   and (not_ready_ok or pod_ready(p))]
        if len(parts) == 4:   # host.service.ns.svc: a pod's own name under its subdomain
            ips = [p["status"]["podIP"] for p in members
                   if p["spec"].get("hostname") == parts[0]
                   and p["spec"].get("subdomain") == service]
            return (NOERROR, ips) if ips else (NXDOMAIN, [])
        if spec.get("clusterIP") not in (None, "", "None"):
            return NOERROR, [spec["clusterIP"]]
        return NOERROR, sorted(p["status"]["podIP"] for p in members)

    def handle(self, packet: bytes) -> bytes | None:
        try:
            _, _, name, _, _ = parse_question(packet)
        except (ValueError, IndexError, struct.error):
            return None
        try:
            rcode, ips = self.resolve(name)
        except Exception:  # a DNS server answers SERVFAIL, it never dies
            rcode, ips = SERVFAIL, []
        return answer(packet, rcode, ips)

    def serve(self, address: str, port: int = 53) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))

        def loop() -> None:
            while True:
                packet, peer = sock.recvfrom(1500)
                reply = self.handle(packet)
                if reply is not None:
                    sock.sendto(reply, peer)

        threading.Thread(target=loop, daemon=True, name=f"dns-{address}").start()
