"""Kubernetes ops: kubeadm guards and server-side apply of gpuk8s-managed manifests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from gpuk8s.facts.kube import ADMIN_CONF, MANAGED_KINDS, ClusterState
from gpuk8s.ops import Op, change, noop, q, sha256
from gpuk8s.sinks import node_arg

KUBECTL = f"kubectl --kubeconfig {ADMIN_CONF}"
#: the Kubernetes packages gpuk8s installs and holds (the Packages fact's key: keep the order)
KUBE_PACKAGES = ("kubeadm", "kubelet", "kubectl")
#: gpuk8s's kubeadm InitConfiguration/ClusterConfiguration on the control plane
KUBEADM_CONFIG = "/etc/kubernetes/gpuk8s/kubeadm-config.yaml"
#: kubeadm's patches folder (patches.directory): per-node changes to the static Pod manifests
KUBEADM_PATCHES = "/etc/kubernetes/gpuk8s/patches"
#: kubeadm reset without a prompt, on containerd's CRI (the Docker runtime uses it too)
KUBEADM_RESET = "kubeadm reset -f --cri-socket unix:///var/run/containerd/containerd.sock"
#: what `kubeadm config images list` adds beside kube-apiserver, -controller-manager,
#: -scheduler and kube-proxy (tagged v<the kubeadm version>), by Kubernetes minor: (CoreDNS,
#: pause, etcd). From kubeadm's constants as `kubeadm config images list` prints them for
#: 1.34.2+, 1.35.0-1.35.7 and 1.36.0-1.36.3 (1.37 from its release candidate); a later patch
#: release may move etcd, so check with `kubeadm config images list` on a node.
KUBEADM_IMAGES = {
    "1.34": ("v1.12.1", "3.10.1", "3.6.5-0"),
    "1.35": ("v1.13.1", "3.10.1", "3.6.6-0"),
    "1.36": ("v1.14.2", "3.10.2", "3.6.8-0"),
    "1.37": ("v1.14.6", "3.10.2", "3.7.0-0"),
}
#: kinds gpuk8s applies: those of MANAGED_KINDS, plus DeviceClass and the DRA driver's
#: ValidatingAdmissionPolicy(Binding) (read by the Dra fact, only on clusters that serve
#: resource.k8s.io)
_MANAGED_KINDS = {"namespace", "serviceaccount", "configmap", "service", "clusterrole",
                  "clusterrolebinding", "daemonset", "deployment", "runtimeclass",
                  "customresourcedefinition", "deviceclass", "validatingadmissionpolicy",
                  "validatingadmissionpolicybinding"}


#: the label on every object gpuk8s applies (cluster add-ons and workloads alike)
MANAGED_BY = "app.kubernetes.io/managed-by"


def label(doc: dict[str, Any], labels: Mapping[str, str],
          also: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Put ``labels`` on an object (and on the nested objects in ``also``: pod templates)."""
    for obj in (doc, *also):
        obj.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
    return doc


def stamp(manifest: str, component: str) -> tuple[str, list[str], str]:
    """Label and annotate every object of a manifest as gpuk8s-managed.

    Returns (stamped YAML, object keys "Kind/namespace/name", sha256 of the input)."""
    digest = sha256(manifest.encode())
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    keys = []
    for doc in docs:
        kind = doc["kind"]
        if kind.lower() not in _MANAGED_KINDS:
            raise ValueError(f"{component}: kind {kind} is not tracked by the Cluster fact "
                             f"({MANAGED_KINDS}); add it there")
        label(doc, {MANAGED_BY: "gpuk8s", "gpuk8s.io/component": component})
        meta = doc["metadata"]
        meta.setdefault("annotations", {})["gpuk8s.io/sha256"] = digest
        keys.append(f"{kind}/{meta.get('namespace', '')}/{meta['name']}")
    return yaml.safe_dump_all(docs, sort_keys=False), keys, digest


def apply_script(text: str, kubectl: str = KUBECTL) -> str:
    """Server-side apply of a YAML stream, sent in a quoted heredoc whose delimiter is derived
    from the text (so no line of the text can end it early)."""
    eof = "GPUK8S_EOF_" + sha256(text.encode())[:12]
    return (f"{kubectl} apply --server-side --force-conflicts --field-manager=gpuk8s -f - "
            f"<<'{eof}'\n{text}{eof}\n")


def apply(cluster: ClusterState, op_id: str, component: str, manifest: str) -> Op:
    """Ensure every object of ``manifest`` is applied (server-side) at this exact content.

    No-op when: every object exists with the manifest's sha256 annotation.
    """
    text, keys, digest = stamp(manifest, component)
    stale = [k for k in keys if cluster.managed.get(k) != digest]
    if cluster.reachable and not stale:
        return noop(op_id, f"= {component}: {len(keys)} objects applied")
    what = "create" if all(k not in cluster.managed for k in keys) else "update"
    return change(op_id, f"+ {what} {component} ({len(stale)} of {len(keys)} objects)",
                  apply_script(text),
                  meta={"objects": ",".join(stale)})


def then_wait(op: Op, what: str, wait: str, timeout: int) -> Op:
    """``op`` (an apply that changes something) followed by ``wait``, in the same op: "<its
    reason>; wait until <what>", its time limit ``timeout``."""
    return change(op.id, f"{op.reason}; wait until {what}", *op.commands, wait, meta=op.meta,
                  timeout=timeout)


def rollout_wait(targets: Sequence[tuple[str, str, str]], timeout: int,
                 kubectl: str = KUBECTL) -> str:
    """Wait until each (namespace, kind/name, pod selector) has rolled out; when one has not
    within ``timeout`` seconds, say which of its pods are not ready, and why, from their
    status and the last lines of their logs (a crash-looping agent's own error), and fail."""
    lines = []
    not_ready = ("jsonpath='{range .items[?(@.status.containerStatuses[0].ready==false)]}"
                 "{.metadata.name}{\"\\n\"}{end}'")
    for ns, what, selector in targets:
        k = f"{kubectl} -n {q(ns)}"
        lines += [
            f"if ! {k} rollout status {q(what)} --timeout={int(timeout)}s >/dev/null 2>&1; then",
            f"  echo {q(f'{what} in {ns} is not ready after {int(timeout)}s:')} >&2",
            f"  {k} get pods -l {q(selector)} -o wide >&2 || true",
            f"  for p in $({k} get pods -l {q(selector)} -o {not_ready} | head -n 2); do",
            '    echo "--- $p: last log lines" >&2',
            f'    {k} logs "$p" --tail=5 2>&1 | cut -c1-400 >&2 || true',
            "  done",
            "  exit 1",
            "fi"]
    return "\n".join(lines)


def pod_diagnosis(namespace: str, selector: str, node: str, container: str,
                  kubectl: str = KUBECTL) -> str:
    """Shell that prints, to stderr, the pod of ``selector`` on ``node``: its state and the
    last lines of ``container``'s log, where a plugin that exits says why ("Insufficient
    Permissions" on MIG devices it may not read, a required flag missing, an NVML error)."""
    pods = (f"{kubectl} -n {q(namespace)} get pods -l {q(selector)} "
            f"--field-selector {q('spec.nodeName=' + node)}")
    return (f"for p in $({pods} -o name | head -n 1); do "
            f'{pods} -o wide >&2; echo "--- $p: last log lines" >&2; '
            f'{kubectl} -n {q(namespace)} logs "$p" -c {q(container)} --tail=4 2>&1 '
            "| cut -c1-400 >&2; done")


def labels(cluster: ClusterState, op_id: str, node: str,
           wanted: Mapping[str, str | None]) -> Op:
    """Ensure a node carries the labels (a None value: the label is absent). No-op when: all
    are present with these values and the None ones are absent."""
    have = cluster.nodes.get(node)
    missing = {k: v for k, v in wanted.items()
               if (have.labels.get(k) if have else None) != v and (v is not None or have)}
    if have and not missing:
        return noop(op_id, f"= {node} labelled")
    pairs = " ".join(f"{k}={v}" if v is not None else f"-{k}"
                     for k, v in sorted(missing.items()))
    words = " ".join(q(f"{k}={v}" if v is not None else f"{k}-")
                     for k, v in sorted(missing.items()))
    return change(op_id, f"+ label {node}: {pairs}",
                  f"{KUBECTL} label node {node_arg(node)} {words} --overwrite")


def feature_gates(value: Mapping[str, Any]) -> dict[str, bool]:
    """The inventory's ``feature_gates`` in the one form every consumer takes: name -> bool,
    sorted (the control plane's ``--feature-gates`` flag, the kubelets' ``featureGates``, the
    facts' view of both)."""
    return {str(name): bool(on) for name, on in sorted(value.items())}


def feature_gate_arg(gates: Mapping[str, bool]) -> str:
    """``A=true,B=false``: the ``--feature-gates`` flag of kube-apiserver, -scheduler and
    -controller-manager (empty when there are no gates)."""
    return ",".join(f"{k}={'true' if v else 'false'}" for k, v in feature_gates(gates).items())


def gate_change(have: Mapping[str, bool], want: Mapping[str, bool]) -> str:
    """``A=true -> false, +B=true, -C``: what moving from ``have`` to ``want`` changes."""
    words = []
    for name in sorted(set(have) | set(want)):
        if name not in want:
            words.append(f"-{name}")
        elif name not in have:
            words.append(f"+{name}={'true' if want[name] else 'false'}")
        elif have[name] != want[name]:
            words.append(f"{name}={'true' if have[name] else 'false'} -> "
                         f"{'true' if want[name] else 'false'}")
    return ", ".join(words)
