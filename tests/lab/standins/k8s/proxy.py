# LAB STAND-IN: not the real kube-proxy. Test infrastructure for gpuk8s; never shipped.
"""kube-proxy's iptables mode, EMULATED by the kubelet stand-in on nodes where the kube-proxy
DaemonSet's pod runs (the lab has no kube-proxy image): Services' ClusterIPs and NodePorts
become DNAT rules to their ready endpoints' pod IPs, in the chains kube-proxy uses
(KUBE-SERVICES, KUBE-NODEPORTS, KUBE-MARK-MASQ, KUBE-POSTROUTING; one rule per endpoint,
chosen at random as kube-proxy does), written with the real iptables-restore. A Service with
a selector gets its ready pods; one without (the API server's `kubernetes` Service in the
default namespace) the addresses of its own Endpoints object, matched by port name, as
kube-proxy takes any Service's endpoints from its EndpointSlices (the lab serves Endpoints
only: pkg/proxy/endpointschangetracker.go; the API server's endpoint reconciler writes
default/kubernetes). The cluster DNS Service is left out: the DNS stand-in answers on its
address on every node (dns.py)."""

from __future__ import annotations

from typing import Any

from .common import pod_ready, run, service_selects

Obj = dict[str, Any]
MASQ_MARK = "0x4000/0x4000"
CHAINS = ("KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-MARK-MASQ", "KUBE-POSTROUTING")
JUMPS = (("PREROUTING", "KUBE-SERVICES"), ("OUTPUT", "KUBE-SERVICES"),
         ("POSTROUTING", "KUBE-POSTROUTING"))
SKIP = {("kube-system", "kube-dns")}


def endpoints(svc: Obj, pods: list[Obj], port: Obj, endpoints_obj: Obj | None = None
              ) -> list[str]:
    """``ip:port`` of the ready pods the Service selects, for one of its ports; for a Service
    without a selector, the ready addresses of its Endpoints object (``endpoints_obj``) under
    a port of the same name and protocol."""
    spec = svc.get("spec", {})
    selector = spec.get("selector") or {}
    if not selector:
        want = (str(port.get("name") or ""), str(port.get("protocol") or "TCP"))
        return sorted({f"{a['ip']}:{p['port']}"
                       for sub in (endpoints_obj or {}).get("subsets") or []
                       for p in sub.get("ports") or []
                       if (str(p.get("name") or ""), str(p.get("protocol") or "TCP")) == want
                       for a in sub.get("addresses") or [] if a.get("ip")})
    out = []
    for p in pods:
        st = p.get("status", {})
        if p["metadata"]["namespace"] != svc["metadata"]["namespace"] or \
                not service_selects(selector, p) or \
                st.get("phase") != "Running" or not st.get("podIP"):
            continue
        if not spec.get("publishNotReadyAddresses") and not pod_ready(p):
            continue
        target = port.get("targetPort", port.get("port"))
        if isinstance(target, str):
            target = next((cp.get("containerPort") for c in p["spec"].get("containers") or []
                           for cp in c.get("ports") or [] if cp.get("name") == target), None)
        if target:
            out.append(f"{st['podIP']}:{target}")
    return sorted(out)


def dnat(rule: str, eps: list[str], comment: str) -> list[str]:
    """kube-proxy's spread over endpoints: rule i matches with probability 1/(n-i)."""
    lines = []
    for i, ep in enumerate(eps):
        left = len(eps) - i
        chance = f" -m statistic --mode random --probability {1 / left:.5f}" if left > 1 else ""
        lines.append(f'{rule} -m comment --comment "{comment}"{chance} -j DNAT '
                     f"--to-destination {ep}")
    return lines


def rules(services: list[Obj], pods: list[Obj]) -> str:
    """The nat table's rules. ``services``: what kube-proxy's informers hold of Services,
    with the Endpoints objects (kind Endpoints) of those that have no selector."""
    endpoint_objs = [o for o in services if o.get("kind") == "Endpoints"]
    services = [o for o in services if o.get("kind") != "Endpoints"]
    lines = ["*nat", *(f":{c} - [0:0]" for c in CHAINS),
             f"-A KUBE-MARK-MASQ -j MARK --or-mark {MASQ_MARK.split('/')[0]}",
             f"-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK} -j RETURN",
             f"-A KUBE-POSTROUTING -j MARK --xor-mark {MASQ_MARK.split('/')[0]}",
             "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring "
             "SNAT\" -j MASQUERADE"]
    by_name = {(e["metadata"].get("namespace"), e["metadata"]["name"]): e
               for e in endpoint_objs}
    for svc in services:
        md, spec = svc["metadata"], svc.get("spec", {})
        if (md["namespace"], md["name"]) in SKIP:
            continue
        for port in spec.get("ports") or []:
            eps = endpoints(svc, pods, port, by_name.get((md["namespace"], md["name"])))
            if not eps:
                continue
            proto = str(port.get("protocol", "TCP")).lower()
            name = f"{md['namespace']}/{md['name']}:{port.get('name', '')}"
            cip = spec.get("clusterIP")
            if cip and cip != "None":
                lines += dnat(f"-A KUBE-SERVICES -d {cip}/32 -p {proto} -m {proto} --dport "
                              f"{port['port']}", eps, f"{name} cluster IP")
            if spec.get("type") in ("NodePort", "LoadBalancer") and port.get("nodePort"):
                match = f"-p {proto} -m {proto} --dport {port['nodePort']}"
                lines.append(f"-A KUBE-NODEPORTS {match} -j KUBE-MARK-MASQ")
                lines += dnat(f"-A KUBE-NODEPORTS {match}", eps, f"{name} node port")
    lines += ["-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS", "COMMIT", ""]
    return "\n".join(lines)


def sync(services: list[Obj], pods: list[Obj], last: str) -> str:
    """Write the rules when they changed; returns what is now in place."""
    text = rules(services, pods)
    if text == last:
        return last
    p = run(["iptables-restore", "--noflush"], input=text)
    if p.returncode != 0:
        raise OSError(f"iptables-restore: {p.stderr.strip()}")
    for chain, target in JUMPS:
        if run(["iptables", "-t", "nat", "-C", chain, "-j", target]).returncode != 0:
            run(["iptables", "-t", "nat", "-I", chain, "1", "-j", target])
    return text
