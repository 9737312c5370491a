"""join: `kubeadm join` with a short-lived token minted for this run, only where not joined.

A worker joins as a node. A control plane beyond the first joins with ``--control-plane`` and
the certificate key the runner minted for this run (the shared certificates were just uploaded
with it): kubeadm adds its etcd member and starts its control plane; the op then waits until the
new API server answers /readyz on the node's own address (its etcd member healthy) before the
next control plane starts (the phase runs one host at a time)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from gpuk8s.checks import Rule, check_duration
from gpuk8s.errors import PlanError
from gpuk8s.facts import Fact
from gpuk8s.facts.certs import CertExpiry, expiry_warning
from gpuk8s.facts.controlplane import TCP_OPEN, ControlPlaneHealth
from gpuk8s.facts.kube import ACCEPT_PENDING, ADMIN_CONF, CORDONED_BY, CORDONED_BY_ACCEPT
from gpuk8s.facts.system import Files
from gpuk8s.ops import Op, change, noop, q, warn, write_file
from gpuk8s.ops.kube import KUBEADM_PATCHES, KUBEADM_RESET
from gpuk8s.roles import HostContext
from gpuk8s.sinks import node_arg

KUBELET_CONF = "/etc/kubernetes/kubelet.conf"
ROOT_KUBECONFIG = "/root/.kube/config"
#: seconds a joined control plane's API server has to answer /readyz
CP_READY_WAIT = 180
JOIN_CONFIG = "/etc/kubernetes/gpuk8s/kubeadm-join.yaml"
#: what a `kubeadm join` that was interrupted before it wrote kubelet.conf leaves behind; the
#: next join's preflight refuses them (FileAvailable--...), so they are reset first
LEFTOVERS = ("/etc/kubernetes/bootstrap-kubelet.conf", "/etc/kubernetes/pki/ca.crt")


#: this role's variables beyond their type (their defaults are in defaults.yaml)
RULES: dict[str, Rule] = {
    "join_token_ttl": Rule(check_duration, cluster_wide=True),
}


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    # a control plane's etcd member and API server (for status; nothing on other nodes)
    return [Files(KUBELET_CONF, *LEFTOVERS), ControlPlaneHealth(), CertExpiry()]


def plan(ctx: HostContext) -> list[Op]:
    states = ctx.facts[Files(KUBELET_CONF, *LEFTOVERS)]
    if states[KUBELET_CONF].exists:
        ops = [noop("join | kubeadm join", f"= {KUBELET_CONF} exists: joined")]
        soon = expiry_warning(ctx.facts[CertExpiry()], dt.datetime.now(dt.UTC))
        if soon and any(cp["host"] == ctx.host for cp in ctx.cluster["control_planes"]):
            ops.append(warn("join | certificates", f"! {soon}"))
        return ops
    left = [path for path in LEFTOVERS if states[path].exists]
    reset = [f"{KUBEADM_RESET} >/dev/null"] if left else []
    after = f" (after kubeadm reset: an interrupted join left {', '.join(left)})" if left else ""
    endpoint = ctx.cluster["endpoint"]
    as_control_plane = any(cp["host"] == ctx.host for cp in ctx.cluster["control_planes"])
    join = ctx.cluster.get("join")
    if join is None:  # plan mode: the token is minted only when applying
        kind = "kubeadm join --control-plane" if as_control_plane else "kubeadm join"
        return [change("join | kubeadm join", f"+ {kind} {endpoint} (token minted at "
                       f"apply time){after}", "false")]
    node = ctx.cluster["nodes"][ctx.host]
    key = ctx.cluster.get("certificate_key") if as_control_plane else None
    config = ctx.template("join-config.yaml.j2", join_endpoint=join["endpoint"],
                          join_token=join["token"], join_ca_hash=join["ca_hash"],
                          node_name=node["name"], node_address=node["address"],
                          certificate_key=key,
                          patches=KUBEADM_PATCHES if ctx.cluster.get("endpoint_mode") == "local_lb"
                          else None)
    if as_control_plane and not key:
        raise PlanError(f"{ctx.host}: a control plane joins with a certificate key, and none "
                        "was minted for this run")
    kind = "kubeadm join --control-plane" if as_control_plane else "kubeadm join"
    steps = [*reset, write_file(JOIN_CONFIG, config, "0600"),
             f"rc=0; kubeadm join --config {JOIN_CONFIG} || rc=$?; rm -f {JOIN_CONFIG}; "
             '[ "$rc" -eq 0 ] || exit "$rc"']
    cordon = not as_control_plane and bool(node.get("gpus")) and \
        bool(ctx.cluster.get("join_cordoned")) and bool(ctx.var("accept_on_add"))
    if cordon:
        steps.append(cordon_self(node["name"]))
        after += " then cordoned until accept --quick passes (accept_on_add)"
    if as_control_plane:
        steps.insert(len(reset), _ports_of(ctx.cluster["control_planes"][0]["address"]))
        steps += [_wait_ready(node["address"]),
                  f"install -D -m 0600 {ADMIN_CONF} {ROOT_KUBECONFIG}"]
    return [change("join | kubeadm join", f"+ {kind} {join['endpoint']}{after}", *steps,
                   secret=True, timeout=900 if as_control_plane else 600)]


#: seconds a new node's kubelet may take to register its Node object after kubeadm join
REGISTER_WAIT = 60


def cordon_self(name: str) -> str:
    """The node cordons itself with its own kubelet credentials (the Node authorizer lets a
    kubelet patch its own Node, and NodeRestriction lets it change spec.unschedulable and
    annotations, not taints: plugin/pkg/admission/noderestriction/admission.go, admitNode) as
    soon as its Node object exists, before the CNI makes it Ready; the annotations say add-node
    did it and that accept has yet to pass."""
    kubectl = f"kubectl --kubeconfig {KUBELET_CONF}"
    n = node_arg(name)
    return (f"i=0; until {kubectl} cordon {n} >/dev/null 2>&1; do i=$((i+1)); "
            f"[ $i -lt {REGISTER_WAIT} ] || {{ echo \"the node did not register in "
            f"{REGISTER_WAIT}s, so it could not be cordoned for accept\" >&2; exit 1; }}; "
            f"sleep 1; done; {kubectl} annotate node {n} {ACCEPT_PENDING}=true "
            f"{CORDONED_BY}={CORDONED_BY_ACCEPT} --overwrite")


#: what a joining control plane must reach on the first one: etcd's client and peer ports and
#: the API server
CONTROL_PLANE_PORTS = (2379, 2380, 6443)


def _ports_of(address: str) -> str:
    """Fail early, in words, when a firewall keeps the control planes apart."""
    host = q(address)
    ports = " ".join(map(str, CONTROL_PLANE_PORTS))
    return (f"for p in {ports}; do {TCP_OPEN} {host} \"$p\" "
            f"2>/dev/null || {{ echo \"this node cannot reach \"{host}\":$p (etcd client 2379, "
            "etcd peer 2380, API server 6443): open TCP 2379-2380 and 6443 between the control "
            "planes\" >&2; exit 1; }; done")


def _wait_ready(address: str) -> str:
    """Wait (up to CP_READY_WAIT s) for the new API server to answer /readyz on its own address,
    which it does once its etcd member is healthy."""
    host = f"[{address}]" if ":" in address else address
    server = q(f"https://{host}:6443")
    late = q(f"the API server on {host} did not become ready within {CP_READY_WAIT}s:")
    return f"""\
end=$(( $(date +%s) + {CP_READY_WAIT} ))
until out=$(kubectl --kubeconfig {ADMIN_CONF} --server {server} --request-timeout=5s \
    get --raw '/readyz?verbose' 2>&1); do
  if [ "$(date +%s)" -ge "$end" ]; then
    echo {late} >&2
    printf '%s\\n' "$out" | grep -v '^\\[+\\]' | tail -n 5 >&2
    exit 1
  fi
  sleep 1
done
"""
