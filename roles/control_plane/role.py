"""control_plane: render and validate the kubeadm config, `kubeadm init` once, admin
kubeconfig for the admin user."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpuk8s.checks import (
    Rule,
    VarProblem,
    check_cidr,
    check_count,
    check_dns_domain,
    check_endpoint,
    check_feature_gates,
    matching,
    parse_network,
)
from gpuk8s.facts import Fact
from gpuk8s.facts.certs import CertExpiry, expiry_warning
from gpuk8s.facts.kube import ADMIN_CONF, GATED_COMPONENTS, Cluster, FeatureGates, GateState
from gpuk8s.facts.system import Files, Packages
from gpuk8s.ops import Op, change, files, noop, q, warn
from gpuk8s.ops.kube import (
    KUBEADM_CONFIG,
    KUBEADM_PATCHES,
    KUBEADM_RESET,
    KUBECTL,
    feature_gate_arg,
    feature_gates,
    gate_change,
)
from gpuk8s.roles import HostContext
from gpuk8s.sinks import unix_user
from roles.control_plane import snapshots

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
#: seconds a restarted API server has to answer with new feature gates before its previous
#: manifests are put back
APISERVER_WAIT = 180
CP_TAINT = "node-role.kubernetes.io/control-plane"


def _cidrs_apart(values: Mapping[str, Any]) -> VarProblem | None:
    """service_cidr and pod_cidr must not overlap."""
    pod, svc = values.get("pod_cidr"), values.get("service_cidr")
    if isinstance(pod, str) and isinstance(svc, str):
        p, s = parse_network(pod), parse_network(svc)
        if p and s and p.version == s.version and p.overlaps(s):
            return VarProblem("service_cidr", f"pod_cidr {pod} and service_cidr {svc} overlap",
                              'use separate ranges, e.g. pod_cidr: "10.244.0.0/16" and '
                              'service_cidr: "10.96.0.0/12"', others=("pod_cidr",))
    return None


#: this role's variables beyond their type (their defaults are in defaults.yaml)
RULES: dict[str, Rule] = {
    "cluster_dns_domain": Rule(check_dns_domain, cluster_wide=True),
    "control_plane_endpoint": Rule(check_endpoint, cluster_wide=True),
    # one set of gates for the control plane and every kubelet: set on some hosts only,
    # gates would silently do nothing
    "feature_gates": Rule(check_feature_gates, cluster_wide=True),
    "pod_cidr": Rule(check_cidr, cluster_wide=True),
    "service_cidr": Rule(check_cidr, cluster_wide=True, across=_cidrs_apart),
    "etcd_backup_schedule": Rule(snapshots.check_schedule, cluster_wide=True),
    "etcd_backup_local_keep": Rule(check_count, cluster_wide=True),
    "certificate_validity_period": Rule(matching(
        r"(\d+h)?(\d+m)?(\d+s)?", 'a duration in hours like "8760h" (kubeadm\'s '
        "certificateValidityPeriod)", '"8760h" (a year), or "" for kubeadm\'s default',
        or_empty=True), cluster_wide=True),
}

def upload_config(ctx: HostContext) -> Op:
    """The cluster's kubeadm-config ConfigMap from gpuk8s's kubeadm config: what `kubeadm
    certs renew` (certificateValidityPeriod), `upgrade` and joins read."""
    return change("control_plane | upload kubeadm config", "+ kubeadm-config ConfigMap from "
                  f"{CONFIG}", f"kubeadm init phase upload-config kubeadm --config {CONFIG}")


HANDLERS = {"restart etcd snapshot timer": lambda ctx: snapshots.restart_timer(),
            "upload kubeadm config": upload_config}


def user_kubeconfig(vars: Mapping[str, Any]) -> str:
    user = unix_user(vars.get("ansible_user", "root"))
    return ROOT_KUBECONFIG if user == "root" else f"/home/{user}/.kube/config"


def _kubeconfig_files(vars: Mapping[str, Any]) -> Files:
    user_conf = user_kubeconfig(vars)
    return Files("+" + CONFIG, ADMIN_CONF, MARKER, ROOT_KUBECONFIG,
                 *([user_conf] if user_conf != ROOT_KUBECONFIG else []))


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [_kubeconfig_files(vars), Packages("kubeadm"), Cluster(), FeatureGates(),
            CertExpiry(), *snapshots.facts()]


def kubeadm_config(ctx: HostContext) -> bytes:
    version = ctx.facts[Packages("kubeadm")].get("kubeadm")
    kubeadm_version = ("v" + version.version.split("-")[0]) if version else \
        f"v{ctx.var('kubernetes_version')}.0"
    gates = feature_gates(ctx.var("feature_gates"))
    return ctx.template("kubeadm-config.yaml.j2", kubeadm_version=kubeadm_version,
                        feature_gates=gates, feature_gate_arg=feature_gate_arg(gates),
                        cert_sans=cert_sans(ctx.cluster),
                        patches=KUBEADM_PATCHES if ctx.cluster.get("endpoint_mode") == "local_lb"
                        else None)


def cert_sans(cluster: Mapping[str, Any]) -> list[str]:
    """The API servers' extra certificate names: the first control plane's address and name,
    the endpoint's host, every control plane's address (any of them may serve the endpoint)."""
    host = cluster["endpoint"].rpartition(":")[0].strip("[]")
    names = [cluster["advertise_address"], cluster["node_name"], host,
             *(cp["address"] for cp in cluster.get("control_planes", ()))]
    return list(dict.fromkeys(n for n in names if n))


def _without_gates(text: bytes | None) -> list[Any] | None:
    """The kubeadm config's documents with every feature gate, the Kubernetes release and the
    certificates' validity taken out (None: not YAML): two configs equal this way differ in
    what gpuk8s moves on a running cluster only (the gates here; the release with `invoke
    upgrade --kubernetes`, whose last phase writes this config again at the installed
    kubeadm's release; the validity, read by `invoke renew-certs`)."""
    import yaml

    try:
        docs = [d for d in yaml.safe_load_all(text or b"") if d]
    except yaml.YAMLError:
        return None
    for doc in docs:
        if not isinstance(doc, dict):
            return None
        doc.pop("featureGates", None)
        doc.pop("kubernetesVersion", None)
        doc.pop("certificateValidityPeriod", None)  # read when certificates are made
        for section in ("apiServer", "controllerManager", "scheduler"):
            part = doc.get(section)
            if not isinstance(part, dict):
                continue
            args = [a for a in part.get("extraArgs") or []
                    if not (isinstance(a, dict) and a.get("name") == "feature-gates")]
            part.pop("extraArgs", None)
            if args:
                part["extraArgs"] = args
            if not part:
                doc.pop(section)
    return docs


def _converge_gates(ctx: HostContext, running: GateState) -> Op:
    """Move the control plane's static pods to the inventory's gates the way kubeadm documents
    reconfiguring a cluster: `init phase control-plane` rewrites the manifests from the
    kubeadm config, the kubelet restarts each changed static pod; once the API server answers
    with the new flag, `init phase upload-config` stores the config for joins and upgrades.
    An API server that does not come back (an unknown gate) gets its old manifests back."""
    want = feature_gates(ctx.var("feature_gates"))
    stale = {c: g for c, g in running.components.items() if g != want}
    flag = feature_gate_arg(want)
    pod = f"kube-apiserver-{ctx.cluster['nodes'][ctx.host]['name']}"
    # the mirror pod's JSON once the kubelet restarted the API server from the new manifest
    quoted = '"--feature-gates=' + flag + '"'
    has_flag = (f"printf '%s' \"$out\" | grep -qF -- {q(quoted)}" if flag else
                "printf '%s' \"$out\" | grep -qF -- '\"kube-apiserver\"' && "
                "! printf '%s' \"$out\" | grep -qF -- '\"--feature-gates='")
    script = f"""\
b=$(mktemp -d /etc/kubernetes/gpuk8s/manifests-before-gates.XXXXXX)
cp -p {' '.join(f'/etc/kubernetes/manifests/{c}.yaml' for c in GATED_COMPONENTS)} "$b"/
kubeadm init phase control-plane all --config {CONFIG} >/dev/null
end=$(( $(date +%s) + {APISERVER_WAIT} )); k="{KUBECTL} --request-timeout=5s"
until out=$($k -n kube-system get pod {q(pod)} -o json 2>/dev/null) && {has_flag} \\
    && $k get --raw /readyz >/dev/null 2>&1; do
  if [ "$(date +%s)" -ge "$end" ]; then
    cp -p "$b"/*.yaml /etc/kubernetes/manifests/
    echo "kube-apiserver did not come back with --feature-gates={flag} within" \
      "{APISERVER_WAIT}s;" \
      "its manifests are restored from $b. See: crictl ps -a | grep kube-apiserver" >&2
    exit 1
  fi
  sleep 2
done
kubeadm init phase upload-config all --config {CONFIG} >/dev/null
rm -rf "$b"
"""
    now = "; ".join(f"{c}: {gate_change(g, want)}" for c, g in sorted(stale.items()))
    return change("control_plane | feature gates", f"+ feature gates {now} (static pods "
                  "rewritten by kubeadm, restarted by the kubelet)", script, timeout=300)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def plan(ctx: HostContext) -> list[Op]:
    f = ctx.facts
    states = f[_kubeconfig_files(ctx.vars)]
    ops: list[Op] = []
    config = kubeadm_config(ctx)
    initialised = states[ADMIN_CONF].exists
    config_op = files.content(states[CONFIG], "control_plane | kubeadm config", config,
                              mode="0600")
    gates_only = _without_gates(states[CONFIG].content) == _without_gates(config)
    if initialised and states[CONFIG].exists and config_op.changes and not gates_only:
        ops.append(warn("control_plane | kubeadm config",
                        f"! {CONFIG} differs from the inventory beyond feature_gates, but the "
                        "cluster is already initialised: kubeadm init does not run twice. "
                        "Apply control-plane changes with `kubeadm upgrade apply` or `invoke "
                        "reset` + bootstrap."))
    elif initialised and states[CONFIG].exists and config_op.changes:
        # the release (after `upgrade --kubernetes`) or the certificates' validity: the file
        # and the cluster's copy of it; gates are applied (and uploaded) below
        ops.append(replace(config_op, notify=("upload kubeadm config",)))
    else:
        ops.append(config_op)
    if initialised and states[MARKER].exists:
        ops.append(noop("control_plane | kubeadm init", f"= {ADMIN_CONF} exists: initialised"))
        running = ctx.facts[FeatureGates()]
        want = feature_gates(ctx.var("feature_gates"))
        if any(g != want for g in running.components.values()) and \
                (gates_only or not states[CONFIG].exists):
            ops.append(_converge_gates(ctx, running))
        else:
            ops.append(noop("control_plane | feature gates",
                            f"= static pods run with the inventory's gates "
                            f"({feature_gate_arg(want) or 'none'})"))
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
    if initialised and (soon := expiry_warning(ctx.facts[CertExpiry()], _now())):
        ops.append(warn("control_plane | certificates", f"! {soon}"))
    ops += snapshots.plan(ctx.facts, str(ctx.var("etcd_backup_schedule") or ""),
                          int(ctx.var("etcd_backup_local_keep")))
    if ctx.var("control_plane_schedulable"):
        node = ctx.facts[Cluster()].nodes.get(ctx.cluster["nodes"][ctx.host]["name"])
        if node is None or any(t.startswith(CP_TAINT + ":") for t in node.taints):
            ops.append(change("control_plane | schedulable",
                              "+ remove the control-plane NoSchedule taint",
                              f"{KUBECTL} taint nodes --all {CP_TAINT}:NoSchedule- || true"))
    return ops
