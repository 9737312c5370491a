"""control_plane: render and validate the kubeadm config, `kubeadm init` once, admin
kubeconfig for the admin user."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuk8s.checks import Rule, check_cidr, check_dns_domain, check_endpoint, check_feature_gates
from gpuk8s.facts import Fact
from gpuk8s.facts.kube import ADMIN_CONF, Cluster
from gpuk8s.facts.system import Files, Packages
from gpuk8s.ops import Op, change, files, noop, q, warn
from gpuk8s.ops.kube import KUBEADM_CONFIG, KUBEADM_RESET, KUBECTL, feature_gate_arg
from gpuk8s.roles import HostContext
from gpuk8s.sinks import unix_user

CONFIG = KUBEADM_CONFIG
#: written right after `kubeadm init` succeeds: admin.conf alone does not prove it finished
#: (kubeadm writes it before the control plane is up and before its post-init steps)
MARKER = "/etc/kubernetes/gpuk8s/init-complete"
ETCD_DATA = "/var/lib/etcd"
SUPER_ADMIN_CONF = "/etc/kubernetes/super-admin.conf"
INIT = (f"kubeadm config validate --config {CONFIG}",
        f"kubeadm init --config {CONFIG} --skip-token-print",
        f"date -u +%FT%TZ > {MARKER}")
#: admin.conf without the marker: adopt a cluster that finished init (kubeadm-config exists);
#: reset and init again one that did not (NotFound, or no API server and no etcd data); never
#: reset a control plane whose API server is down but whose etcd holds data
RECOVER = f"""\
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
# super-admin.conf (system:masters): admin.conf's RBAC binding is one of init's last steps
conf={ADMIN_CONF}; [ -f {SUPER_ADMIN_CONF} ] && conf={SUPER_ADMIN_CONF}
if kubectl --kubeconfig "$conf" --request-timeout=10s -n kube-system get configmap \
    kubeadm-config -o name >"$d/out" 2>"$d/err"; then
  echo "kubeadm-config exists: kubeadm init had finished; recording it"
elif grep -q NotFound "$d/err" || [ -z "$(ls -A {ETCD_DATA} 2>/dev/null)" ]; then
  echo "kubeadm init did not finish ($(tail -n 1 "$d/err")): kubeadm reset, then init again"
  {KUBEADM_RESET} >/dev/null
  {INIT[0]}
  {INIT[1]}
else
  echo "admin.conf exists but the API server does not answer: $(tail -n 1 "$d/err")"
  echo "and {ETCD_DATA} holds data, so gpuk8s will not reset a control plane that may be live."
  echo "If kubeadm init was interrupted on this host: kubeadm reset -f here, then bootstrap again."
  exit 1
fi
{INIT[2]}
"""
ROOT_KUBECONFIG = "/root/.kube/config"
CP_TAINT = "node-role.kubernetes.io/control-plane"


#: this role's variables beyond their type (their defaults are in defaults.yaml)
RULES: dict[str, Rule] = {
    "cluster_dns_domain": Rule(check_dns_domain, cluster_wide=True),
    "control_plane_endpoint": Rule(check_endpoint, cluster_wide=True),
    # one set of gates for the control plane and every kubelet: set on some hosts only,
    # gates would silently do nothing
    "feature_gates": Rule(check_feature_gates, cluster_wide=True),
    "pod_cidr": Rule(check_cidr, cluster_wide=True),
    "service_cidr": Rule(check_cidr, cluster_wide=True),
}


def user_kubeconfig(vars: Mapping[str, Any]) -> str:
    user = unix_user(vars.get("ansible_user", "root"))
    return ROOT_KUBECONFIG if user == "root" else f"/home/{user}/.kube/config"


def _kubeconfig_files(vars: Mapping[str, Any]) -> Files:
    user_conf = user_kubeconfig(vars)
    return Files("+" + CONFIG, ADMIN_CONF, MARKER, ROOT_KUBECONFIG,
                 *([user_conf] if user_conf != ROOT_KUBECONFIG else []))


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [_kubeconfig_files(vars), Packages("kubeadm"), Cluster()]


def kubeadm_config(ctx: HostContext) -> bytes:
    version = ctx.facts[Packages("kubeadm")].get("kubeadm")
    kubeadm_version = ("v" + version.version.split("-")[0]) if version else \
        f"v{ctx.var('kubernetes_version')}.0"
    return ctx.template("kubeadm-config.yaml.j2", kubeadm_version=kubeadm_version,
                        feature_gate_arg=feature_gate_arg(ctx.var("feature_gates")))


def plan(ctx: HostContext) -> list[Op]:
    f = ctx.facts
    states = f[_kubeconfig_files(ctx.vars)]
    ops: list[Op] = []
    config = kubeadm_config(ctx)
    initialised = states[ADMIN_CONF].exists
    if initialised and states[CONFIG].exists and \
            files.content(states[CONFIG], "x", config, mode="0600").changes:
        ops.append(warn("control_plane | kubeadm config",
                        f"! {CONFIG} differs from the inventory, but the cluster is already "
                        "initialised: kubeadm init does not run twice. Apply control-plane "
                        "changes with `kubeadm upgrade apply` or `invoke reset` + bootstrap."))
    else:
        ops.append(files.content(states[CONFIG], "control_plane | kubeadm config", config,
                                 mode="0600"))
    if initialised and states[MARKER].exists:
        ops.append(noop("control_plane | kubeadm init", f"= {ADMIN_CONF} exists: initialised"))
    elif initialised:
        ops.append(change("control_plane | kubeadm init",
                          f"+ finish kubeadm init: {ADMIN_CONF} exists but {MARKER} does not "
                          "(a cluster that finished init is adopted; an interrupted init is "
                          "reset and run again)", RECOVER, timeout=900))
    else:
        ops.append(change("control_plane | kubeadm init",
                          f"+ kubeadm init (endpoint {ctx.cluster['endpoint']})", *INIT,
                          timeout=900))
    # root gets kubectl on the control plane, and so does the login user when it is not root
    user = unix_user(ctx.vars.get("ansible_user", "root"))
    for who, path in {"root": ROOT_KUBECONFIG, user: user_kubeconfig(ctx.vars)}.items():
        op_id = "control_plane | admin kubeconfig" + (f" for {who}" if who != "root" else "")
        if initialised and states[path].exists and \
                states[path].sha256 == states[ADMIN_CONF].sha256:
            ops.append(noop(op_id, f"= {path} is admin.conf"))
        else:
            ops.append(change(op_id, f"+ {path} for {who} (0600)",
                              f"install -D -m 0600 -o {q(who)} -g \"$(id -gn {q(who)})\" "
                              f"{ADMIN_CONF} {q(path)}"))
    if ctx.var("control_plane_schedulable"):
        node = ctx.facts[Cluster()].nodes.get(ctx.cluster["nodes"][ctx.host]["name"])
        if node is None or any(t.startswith(CP_TAINT + ":") for t in node.taints):
            ops.append(change("control_plane | schedulable",
                              "+ remove the control-plane NoSchedule taint",
                              f"{KUBECTL} taint nodes --all {CP_TAINT}:NoSchedule- || true"))
    return ops
