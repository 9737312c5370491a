"""join: `kubeadm join` with a short-lived token minted for this run, only where not joined."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuk8s.checks import Rule, check_duration
from gpuk8s.facts import Fact
from gpuk8s.facts.system import Files
from gpuk8s.ops import Op, change, noop, write_file
from gpuk8s.ops.kube import KUBEADM_RESET
from gpuk8s.roles import HostContext

KUBELET_CONF = "/etc/kubernetes/kubelet.conf"
JOIN_CONFIG = "/etc/kubernetes/gpuk8s/kubeadm-join.yaml"
#: what a `kubeadm join` that was interrupted before it wrote kubelet.conf leaves behind; the
#: next join's preflight refuses them (FileAvailable--...), so they are reset first
LEFTOVERS = ("/etc/kubernetes/bootstrap-kubelet.conf", "/etc/kubernetes/pki/ca.crt")


#: this role's variables beyond their type (their defaults are in defaults.yaml)
RULES: dict[str, Rule] = {
    "join_token_ttl": Rule(check_duration, cluster_wide=True),
}


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [Files(KUBELET_CONF, *LEFTOVERS)]


def plan(ctx: HostContext) -> list[Op]:
    states = ctx.facts[Files(KUBELET_CONF, *LEFTOVERS)]
    if states[KUBELET_CONF].exists:
        return [noop("join | kubeadm join", f"= {KUBELET_CONF} exists: joined")]
    left = [path for path in LEFTOVERS if states[path].exists]
    reset = [f"{KUBEADM_RESET} >/dev/null"] if left else []
    after = f" (after kubeadm reset: an interrupted join left {', '.join(left)})" if left else ""
    endpoint = ctx.cluster["endpoint"]
    join = ctx.cluster.get("join")
    if join is None:  # plan mode: the token is minted only when applying
        return [change("join | kubeadm join", f"+ kubeadm join {endpoint} (token minted at "
                       f"apply time){after}", "false")]
    node = ctx.cluster["nodes"][ctx.host]
    config = ctx.template("join-config.yaml.j2", join_endpoint=join["endpoint"],
                          join_token=join["token"], join_ca_hash=join["ca_hash"],
                          node_name=node["name"], node_address=node["address"])
    return [change("join | kubeadm join", f"+ kubeadm join {join['endpoint']}{after}",
                   *reset, write_file(JOIN_CONFIG, config, "0600"),
                   f"rc=0; kubeadm join --config {JOIN_CONFIG} || rc=$?; rm -f {JOIN_CONFIG}; "
                   "exit $rc", secret=True, timeout=600)]
