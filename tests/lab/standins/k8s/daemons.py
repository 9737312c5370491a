# LAB STAND-IN: not the real kubelet, nor the daemons it plays. Test infrastructure for gpuk8s;
# never shipped to users.
"""The system daemons the lab cannot run (their images do not exist here), EMULATED by the
kubelet stand-in: ONE registry, DAEMONS, one entry per daemon. An entry says how its pod is
recognised (a needle in one of the pod's images: the kubelet then runs the pod emulated,
Running without a process), what its pod does to the node when the kubelet starts it, which of
its containers run an emulated program (programs.py: at the container's start and after each
CrashLoopBackOff pause while it fails) and the log a container starts with, what it registers
with the kubelet's device manager, and what it does on every kubelet sync. The kubelet
(kubelet.py) iterates the registry; it names no daemon."""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import dcgm, device_plugin, dns, dra_node, programs, proxy
from .client import ApiError, TLSError, Unreachable, follow
from .common import klog, read, run, write

if TYPE_CHECKING:
    from .kubelet import Kubelet

Obj = dict[str, Any]
CNI_DIR = "/etc/cni/net.d"
FLANNEL_PLUGIN = "/opt/cni/bin/flannel"
#: what a container runs: the kubelet, the pod, the container -> how it went
Program = Callable[["Kubelet", Obj, Obj], programs.Outcome]


@dataclass(frozen=True)
class Container:
    """A kind of container of a daemon: a needle in its image, and its name or command where
    one image serves several containers."""

    image: str
    name: str | None = None
    command: str | None = None
    #: run at the container's start, and again after each CrashLoopBackOff pause (or readiness
    #: period) while it fails
    program: Program | None = None
    #: the log it starts with (the kubelet, the pod's runtime handler -> text)
    log: Callable[[Kubelet, str | None], str] | None = None

    def matches(self, container: Obj) -> bool:
        return self.image in (container.get("image") or "") and \
            self.name in (None, container.get("name")) and \
            self.command in (None, (container.get("command") or [""])[0])


@dataclass(frozen=True)
class Daemon:
    """One emulated daemon: ``image`` in any image of a pod (containers or init containers)
    makes the pod this daemon's."""

    name: str
    image: str
    containers: tuple[Container, ...] = ()
    #: what the pod does to the node when the kubelet starts it (its init containers' work)
    start: Callable[[Kubelet, Obj], None] | None = None
    #: what it does on every kubelet sync (the node's pods)
    sync: Callable[[Kubelet, list[Obj]], None] | None = None
    #: what it registers with the kubelet's device manager: resource name -> device IDs
    resources: Callable[[Kubelet, list[Obj]], dict[str, list[str]]] | None = None

    def matches(self, pod: Obj) -> bool:
        spec = pod["spec"]
        return any(self.image in (c.get("image") or "")
                   for c in (spec.get("containers") or []) + (spec.get("initContainers") or []))


def as_pod(fn: Callable[[programs.Api, Obj, Obj, str], programs.Outcome]) -> Program:
    """A program that makes its start-up calls to the API as the pod's ServiceAccount
    (programs.py): without a token it cannot load its in-cluster configuration and exits."""
    @functools.wraps(fn)
    def program(k: Kubelet, pod: Obj, container: Obj) -> programs.Outcome:
        api = k.pod_api(pod)
        if api is None:
            return programs.Outcome("crash", [
                "unable to load in-cluster configuration: no ServiceAccount token"], 1)
        return fn(api, pod, container, k.node_name)

    return program


def running(pods: list[Obj], image: str) -> Obj | None:
    """The first Running pod with a container whose image contains ``image``."""
    return next((p for p in pods if p.get("status", {}).get("phase") == "Running" and
                 any(image in (c.get("image") or "")
                     for c in p["spec"].get("containers") or [])), None)


# ------------------------------------------------------------------ flannel, calico
def emulate_flannel(k: Kubelet, pod: Obj) -> None:
    """flannel's init containers: install-cni-plugin copies the flannel CNI plugin to
    /opt/cni/bin/flannel (here: the stand-in plugin, flannel_cni.py, which delegates to the
    real bridge and host-local plugins); install-cni copies cni-conf.json from the ConfigMap."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "flannel_cni.py")) as f:
        write(FLANNEL_PLUGIN, f.read(), 0o755)
    conf = (flannel_config(k, pod) or {}).get("cni-conf.json")
    if conf:
        write(f"{CNI_DIR}/10-flannel.conflist", conf)


def flannel_config(k: Kubelet, pod: Obj) -> dict[str, str] | None:
    """The data of the ConfigMap flannel's pod mounts (kube-flannel-cfg)."""
    cm_name = next((v["configMap"]["name"] for v in pod["spec"].get("volumes") or []
                    if "configMap" in v), "kube-flannel-cfg")
    try:
        cm = k.client.get(f"/api/v1/namespaces/{pod['metadata']['namespace']}/configmaps/"
                          f"{cm_name}")
    except ApiError:
        return None
    return cm.get("data") or {}


def _ipv4_routes() -> set[tuple[str, str]]:
    """The node's IPv4 routes with a gateway, as (network, gateway), from /proc/net/route
    (addresses there are little-endian hex): flanneld's routes already in place are not
    replaced again on every sync."""
    routes = set()
    try:
        with open("/proc/net/route") as f:
            rows = f.read().splitlines()[1:]
    except OSError:
        return routes
    for row in rows:
        cols = row.split()
        if len(cols) < 8 or cols[2] == "00000000":
            continue
        dest, gw, mask = (str(ipaddress.IPv4Address(bytes.fromhex(c)[::-1]))
                          for c in (cols[1], cols[2], cols[7]))
        routes.add((str(ipaddress.ip_network(f"{dest}/{mask}", strict=False)), gw))
    return routes


def _route_key(network: str, gateway: str) -> tuple[str, str]:
    try:
        return str(ipaddress.ip_network(network, strict=False)), gateway
    except ValueError:
        return network, gateway


def flannel_daemon(k: Kubelet, pod: Obj, nodes: list[Obj]) -> None:
    """What flanneld does on each node, with the host-gw backend (EMULATED: no flanneld runs):
    lease the node's podCIDR (write /run/flannel/subnet.env), route every other node's podCIDR
    via that node's InternalIP, and masquerade pod traffic leaving the pod network. The lab
    template asks for vxlan; host-gw gives the same reachability on the lab's one L2 bridge."""
    me = next((n for n in nodes if n["metadata"]["name"] == k.node_name), None)
    cidr = (me or {}).get("spec", {}).get("podCIDR")
    if not cidr:
        return  # flanneld waits for the node's podCIDR ("Waiting for node to have a subnet")
    net = json.loads((flannel_config(k, pod) or {}).get("net-conf.json") or "{}")
    network = net.get("Network", "10.244.0.0/16")
    gateway = str(next(ipaddress.ip_network(cidr).hosts()))
    env = (f"FLANNEL_NETWORK={network}\nFLANNEL_SUBNET={gateway}/"
           f"{ipaddress.ip_network(cidr).prefixlen}\nFLANNEL_MTU=1500\nFLANNEL_IPMASQ=true\n")
    if read("/run/flannel/subnet.env") != env:
        write("/run/flannel/subnet.env", env)
    if os.environ.get("GPUK8S_LAB_ROOT"):
        return  # unit tests on the host: no routes or iptables
    have = _ipv4_routes()
    for n in nodes:
        other = n.get("spec", {}).get("podCIDR")
        ip = next((a["address"] for a in n.get("status", {}).get("addresses") or []
                   if a.get("type") == "InternalIP"), None)
        if n["metadata"]["name"] != k.node_name and other and ip and \
                _route_key(other, ip) not in have:
            run(["ip", "route", "replace", other, "via", ip])
    rule = ["POSTROUTING", "-s", network, "!", "-d", network, "-j", "MASQUERADE",
            "-m", "comment", "--comment", "flanneld masq"]
    if run(["iptables", "-t", "nat", "-C", *rule]).returncode != 0:
        run(["iptables", "-t", "nat", "-A", *rule])


def emulate_calico(k: Kubelet, pod: Obj) -> None:
    """calico/cni's install-cni init container: takes CNI_NETWORK_CONFIG (from the ConfigMap
    key it names), fills in the node name, MTU and kubeconfig path, and writes CNI_CONF_NAME.
    No config (a missing ConfigMap or key) means no CNI config: the node stays NotReady."""
    init = next((c for c in pod["spec"].get("initContainers") or []
                 if "calico/cni" in (c.get("image") or "")), None)
    if init is None:
        return
    env = {e["name"]: e for e in init.get("env") or []}

    def value(name: str) -> str | None:
        e = env.get(name)
        if e is None:
            return None
        if "value" in e:
            return str(e["value"])
        ref = (e.get("valueFrom") or {}).get("configMapKeyRef")
        if ref is None:
            return None
        try:
            cm = k.client.get(f"/api/v1/namespaces/{pod['metadata']['namespace']}/configmaps/"
                              f"{ref['name']}")
        except ApiError:
            return None
        got = (cm.get("data") or {}).get(ref["key"])
        return None if got is None else str(got)

    template = value("CNI_NETWORK_CONFIG")
    if not template:
        return
    mtu = value("CNI_MTU") or "1500"
    conf = (template.replace("__KUBERNETES_NODE_NAME__", k.node_name)
            .replace("__CNI_MTU__", "1450" if mtu == "0" else mtu)
            .replace("__KUBECONFIG_FILEPATH__", f"{CNI_DIR}/calico-kubeconfig"))
    try:
        json.loads(conf)
    except ValueError as e:  # install-cni refuses a config that is not JSON, and so do we
        klog("E", f"install-cni: CNI_NETWORK_CONFIG is not valid JSON: {e}", "install.go:230")
        return
    write(f"{CNI_DIR}/{value('CNI_CONF_NAME') or '10-calico.conflist'}", conf + "\n")


def flanneld(k: Kubelet, pods: list[Obj]) -> None:
    """flanneld's lease and routes, once its start-up calls (programs.flanneld) passed."""
    flannel = running(pods, "flannel")
    if flannel is None:
        return
    started = k.programs.get((flannel["metadata"]["uid"], "kube-flannel"))
    if started is None or started[0].state == "ok":
        flannel_daemon(k, flannel, k.client.get("/api/v1/nodes")["items"])


# ------------------------------------------------------------------ kube-proxy, CoreDNS
def kube_proxy(k: Kubelet, pods: list[Obj]) -> None:
    """kube-proxy's Service rules, once its pod runs on the node."""
    if os.environ.get("GPUK8S_LAB_ROOT"):
        return   # unit tests on the host: no iptables
    if running(pods, "kube-proxy") is not None and not k.proxy_started:
        # kube-proxy follows Services and endpoints within a second, not at the kubelet's
        # status period: its own loop
        threading.Thread(target=proxy_loop, args=(k,), daemon=True, name="kube-proxy").start()
        k.proxy_started = True


#: kube-proxy's full resync, its --iptables-sync-period default (30s); between them it acts
#: on its informers' events only
PROXY_RESYNC = 30.0
#: the real watch ends after a server-chosen timeout and the informer opens it again
PROXY_WATCH_SECONDS = 60


def proxy_loop(k: Kubelet) -> None:
    """kube-proxy's sync loop: the Service rules from a list of services and pods each time a
    watch saw a change (or every PROXY_RESYNC seconds), as the real proxier syncs on its
    informers' events, instead of listing every pod of the cluster each second; a failed sync
    is tried again a second later."""
    rules = ""
    changed = threading.Event()
    changed.set()
    for kind in ("services", "pods"):   # its two informers
        threading.Thread(target=follow, daemon=True, name=f"kube-proxy-{kind}", args=(
            k.client, f"/api/v1/{kind}?watch=true&timeoutSeconds={PROXY_WATCH_SECONDS}",
            PROXY_WATCH_SECONDS, changed)).start()
    while True:
        changed.wait(PROXY_RESYNC)
        changed.clear()
        try:
            services = k.client.get("/api/v1/services")["items"]
            rules = proxy.sync(services + selectorless_endpoints(k, services),
                               k.client.get("/api/v1/pods")["items"], rules)
        except (ApiError, Unreachable, TLSError, OSError) as e:
            klog("E", f'"Failed to sync proxy rules" err="{e}"', "proxier.go:1520")
            changed.set()
            time.sleep(1)
            continue
        time.sleep(0.2)   # a burst of events (a Deployment's pods) gives one sync


def selectorless_endpoints(k: Kubelet, services: list[Obj]) -> list[Obj]:
    """The Endpoints objects of the Services without a selector (the API server's
    default/kubernetes, which its endpoint reconciler writes): their endpoints, for
    proxy.rules. Read at each sync (a change reaches the rules at the next event or
    resync, PROXY_RESYNC: the lab's kube-proxy watches no Endpoints)."""
    out = []
    for svc in services:
        if (svc.get("spec") or {}).get("selector"):
            continue
        md = svc["metadata"]
        try:
            got = k.client.get(f"/api/v1/namespaces/{md['namespace']}/endpoints/{md['name']}")
        except ApiError:
            continue
        out.append({**got, "kind": "Endpoints"})
    return out


def cluster_dns(k: Kubelet, pods: list[Obj]) -> None:
    """CoreDNS: once kubeadm's kube-dns Service exists, the cluster DNS on this node (dns.py,
    on the node's loopback at clusterDNS, as NodeLocal DNSCache binds it), whichever node
    the CoreDNS pods run on."""
    if os.environ.get("GPUK8S_LAB_ROOT") or k.dns_started:
        return   # unit tests on the host: no port 53
    try:
        k.client.get("/api/v1/namespaces/kube-system/services/kube-dns")
    except ApiError:
        return
    for ip in k.cfg.get("clusterDNS") or []:
        run(["ip", "addr", "replace", f"{ip}/32", "dev", "lo"])
        dns.ClusterDNS(k.client, k.cfg.get("clusterDomain", "cluster.local")).serve(ip)
    k.dns_started = True


# ------------------------------------------------------------------ the registry
DAEMONS = (
    Daemon("flannel", "flannel", start=emulate_flannel, sync=flanneld, containers=(
        Container("flannel-io/flannel:", program=as_pod(programs.flanneld)),)),
    Daemon("calico", "calico/", start=emulate_calico, containers=(
        Container("calico/node:", program=as_pod(programs.calico_node)),
        Container("calico/kube-controllers:", program=as_pod(programs.calico_kube_controllers)))),
    Daemon("kube-proxy", "kube-proxy", sync=kube_proxy),
    Daemon("CoreDNS", "coredns", sync=cluster_dns),
    Daemon("NVIDIA device plugin", device_plugin.IMAGE, resources=device_plugin.resources,
           containers=(
               Container(device_plugin.IMAGE, name=device_plugin.CONTAINER,
                         program=device_plugin.program, log=device_plugin.start_log),
               Container(device_plugin.IMAGE, log=device_plugin.start_log))),
    Daemon("dcgm-exporter", "dcgm-exporter", start=dcgm.emulate_dcgm_exporter),
    # the DRA driver's gpus container only
    Daemon("NVIDIA DRA kubelet plugin", dra_node.IMAGE, sync=dra_node.sync, containers=(
        Container(f"{dra_node.IMAGE}:", command="gpu-kubelet-plugin",
                  program=as_pod(programs.dra_gpu_plugin)),)),
)


def emulated(pod: Obj) -> bool:
    """Whether the kubelet emulates the pod (else it runs for real, realpods.py)."""
    return any(d.matches(pod) for d in DAEMONS)


def container(c: Obj) -> Container | None:
    """The registry's entry for a container of an emulated pod (None: it just runs)."""
    return next((e for d in DAEMONS for e in d.containers if e.matches(c)), None)


def start(k: Kubelet, pod: Obj) -> None:
    """The kubelet starts an emulated pod: what it does to the node."""
    for d in DAEMONS:
        if d.start is not None and d.matches(pod):
            d.start(k, pod)


def sync(k: Kubelet, pods: list[Obj]) -> None:
    """Every kubelet sync: what the daemons do on this node."""
    for d in DAEMONS:
        if d.sync is not None:
            d.sync(k, pods)


def resources(k: Kubelet, pods: list[Obj]) -> dict[str, list[str]]:
    """What the daemons on this node register with the kubelet's device manager."""
    out: dict[str, list[str]] = {}
    for d in DAEMONS:
        if d.resources is not None:
            out.update(d.resources(k, pods))
    return out
