"""Kubernetes ops: kubeadm guards and server-side apply of gpuk8s-managed manifests."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from gpuk8s.facts.kube import (
    ADMIN_CONF,
    DRA_RESOURCES,
    MANAGED_KINDS,
    MANAGED_RESOURCES,
    ClusterState,
)
from gpuk8s.ops import Op, change, noop, q, sha256
from gpuk8s.sinks import node_arg

KUBECTL = f"kubectl --kubeconfig {ADMIN_CONF}"
#: the Kubernetes packages gpuk8s installs and holds (the Packages fact's key: keep the order)
KUBE_PACKAGES = ("kubeadm", "kubelet", "kubectl")
#: the pkgs.k8s.io source and its key, as roles/kubernetes writes them
KUBE_REPO_LIST = "/etc/apt/sources.list.d/kubernetes.list"
KUBE_REPO_KEYRING = "/etc/apt/keyrings/kubernetes-apt-keyring.gpg"
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
#: kinds gpuk8s applies (lowercase): those the Cluster fact reads, plus DeviceClass and the DRA
#: driver's ValidatingAdmissionPolicy(Binding) (read by the Dra fact, only on clusters that
#: serve resource.k8s.io)
_MANAGED_KINDS = {kind.lower() for kind in (*MANAGED_RESOURCES, *DRA_RESOURCES)}


#: the label on every object gpuk8s applies (cluster add-ons and workloads alike)
MANAGED_BY = "app.kubernetes.io/managed-by"


def release(version: str) -> tuple[int, ...]:
    """(major, minor[, patch]) of a Kubernetes version, package version or prefix: "v1.36.2",
    "1.36.2-1.1" -> (1, 36, 2); "1.37", "1.37." -> (1, 37); () when it is none of them."""
    m = re.match(r"v?(\d+(?:\.\d+){0,2})", version.strip())
    return tuple(int(x) for x in m[1].split(".")) if m else ()


def release_prefix(target: str) -> str:
    """The package version prefix of a Kubernetes release: "1.37" -> "1.37." (any patch),
    "1.36.2" -> "1.36.2-" (that patch, any package revision)."""
    return f"{target}-" if target.count(".") == 2 else f"{target}."


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
                             f"({MANAGED_KINDS}) nor the Dra fact; add it to MANAGED_RESOURCES "
                             "in gpuk8s/facts/kube.py")
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


def nodes_ready_wait(names: Sequence[str], timeout: int, kubectl: str = KUBECTL) -> str:
    """Shell that waits, ``timeout`` seconds in all, until each node in ``names`` exists and
    then until it is Ready. ``kubeadm join`` returns once the kubelet's TLS bootstrap is done
    (its kubelet-wait-bootstrap phase); the kubelet registers its Node a moment later, and
    ``kubectl wait`` fails at once on a Node that does not exist yet."""
    refs = " ".join(node_arg(n, "node/") for n in names)
    t = int(timeout)
    return "\n".join([
        f"end=$(( $(date +%s) + {t} ))",
        f"until {kubectl} get {refs} >/dev/null 2>&1; do",
        "  if [ $(date +%s) -ge $end ]; then",
        f"    echo 'these nodes did not register within {t}s:' >&2",
        f"    {kubectl} get {refs} >&2; exit 1",
        "  fi",
        "  sleep 2",
        "done",
        "left=$(( end - $(date +%s) )); [ $left -gt 0 ] || left=1",
        f"{kubectl} wait --for=condition=Ready {refs} --timeout=${{left}}s"])


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
    """Shell that prints, to stderr, the pod of ``selector`` on ``node``: its state, its
    latest Warning events (a pod that never started says why there: FailedMount,
    FailedCreatePodSandBox, an image it cannot pull) and the last lines of ``container``'s log,
    where a plugin that exits says why ("Insufficient Permissions" on MIG devices it may not
    read, a required flag missing, an NVML error). Its JSON form, for the workload waits that
    read the pod and its events themselves: :func:`pod_problem`."""
    pods = (f"{kubectl} -n {q(namespace)} get pods -l {q(selector)} "
            f"--field-selector {q('spec.nodeName=' + node)}")
    events = (f'{kubectl} -n {q(namespace)} get events --field-selector '
              '"involvedObject.name=${p#pod/},type=Warning" --sort-by=.lastTimestamp '
              "-o jsonpath='{range .items[*]}{.reason}: {.message}{\"\\n\"}{end}'")
    return (f"for p in $({pods} -o name | head -n 1); do "
            f'{pods} -o wide >&2; echo "--- $p: latest warning events" >&2; '
            f"{events} 2>&1 | tail -n 3 | cut -c1-400 >&2; "
            f'echo "--- $p: last log lines" >&2; '
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


# -- why a pod does not start ---------------------------------------------------------------------
#: seconds a FailedMount must last before it is a problem: the kubelet retries a mount with
#: back-off (an NFS server that answers a moment late, a claim bound just after the pod), so a
#: first failure is not final
MOUNT_GRACE = 45.0

#: container waiting reasons that do not go away by waiting, in the kubelet's own words
#: (kubernetes v1.35.0: pkg/kubelet/images/types.go ErrImagePull, ImagePullBackOff,
#: ErrImageNeverPull, InvalidImageName; pkg/kubelet/kuberuntime/kuberuntime_container.go
#: CreateContainerConfigError, CreateContainerError; pkg/kubelet/container/sync_result.go
#: CrashLoopBackOff, RunContainerError), and what to do about each
_PULL_FIX = ("check the image name and that the node reaches its registry (the inventory's "
             "registry_mirrors); crictl pull IMAGE on the node shows the same error")
WAITING_FIXES = {
    "ErrImagePull": _PULL_FIX,
    "ImagePullBackOff": _PULL_FIX,
    "ErrImageNeverPull": "imagePullPolicy is Never and the image is not on the node: load it "
                         "there or --set imagePullPolicy=IfNotPresent",
    "InvalidImageName": "the image reference is malformed: correct the image value",
    "CreateContainerConfigError": "the pod names a ConfigMap, Secret or key that does not "
                                  "exist: create it, or correct the values",
    "CreateContainerError": "the runtime could not create the container: the message names "
                            "the cause (a mount, a device, a security setting)",
    "RunContainerError": "the runtime could not start the container's command: check the "
                         "command and the image",
    "CrashLoopBackOff": "the container keeps exiting: kubectl -n {ns} logs {pod} -c "
                        "{container} --previous shows why",
}
OOM_FIX = ("the container used more memory than its limit and the kernel killed it: raise "
           "the limit (--set memory=...) or make the program use less")
MOUNT_FIX = ("the node cannot mount the volume: check that its source exists (an NFS export: "
             "the server's exportfs -v, and that this node may mount it), or correct the "
             "claim's PersistentVolume; the pod starts once the mount works")


@dataclass(frozen=True)
class PodProblem:
    """Why a pod is not starting, in the kubelet's words: ``reason`` (FailedMount,
    ImagePullBackOff, CrashLoopBackOff, OOMKilled, CreateContainerError...), ``message`` (the
    event's or the container state's text), ``fix`` (what to do), ``grace`` (seconds the state
    must last before it will not heal by waiting; 0: at once)."""

    reason: str
    message: str
    fix: str
    container: str = ""
    grace: float = 0.0


def _waiting(pod: Mapping[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(container, waiting state, last terminated state) of the pod's waiting containers."""
    st = pod.get("status") or {}
    out = []
    for c in [*(st.get("initContainerStatuses") or []), *(st.get("containerStatuses") or [])]:
        waiting = (c.get("state") or {}).get("waiting")
        if waiting is not None:
            out.append((str(c.get("name", "")), dict(waiting),
                        dict((c.get("lastState") or {}).get("terminated") or {})))
    return out


def pod_problem(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]] = ()
                ) -> PodProblem | None:
    """What keeps ``pod`` (kubectl's JSON) from starting that waiting will not mend, from its
    container states and its ``events`` (oldest first): a crash loop (OOMKilled when the last
    exit was the kernel's OOM killer), an image that cannot be pulled, a container the runtime
    cannot create, or a volume that cannot be mounted (FailedMount, the latest Warning event
    while the pod is still ContainerCreating: ``grace`` MOUNT_GRACE, as the kubelet retries).
    None: it is starting, running or done. The shell form for rollout waits is
    :func:`pod_diagnosis`."""
    for name, waiting, last in _waiting(pod):
        reason = str(waiting.get("reason", ""))
        if reason == "CrashLoopBackOff" and last.get("reason") == "OOMKilled":
            return PodProblem("OOMKilled", f"container {name} was OOMKilled (exit code "
                              f"{last.get('exitCode', 137)}) and is restarted with back-off",
                              OOM_FIX, name)
        if reason in WAITING_FIXES:
            message = str(waiting.get("message", ""))
            if reason == "CrashLoopBackOff" and last:
                message = (f"container {name} ended with exit code {last.get('exitCode')} "
                           f"({last.get('reason', 'Error')}); {message}").rstrip("; ")
            md = pod.get("metadata") or {}
            fix = WAITING_FIXES[reason].format(ns=md.get("namespace", "default"),
                                               pod=md.get("name", ""), container=name)
            return PodProblem(reason, message, fix, name)
    st = pod.get("status") or {}
    for c in [*(st.get("initContainerStatuses") or []), *(st.get("containerStatuses") or [])]:
        term = (c.get("state") or {}).get("terminated") or {}
        if term.get("reason") == "OOMKilled":
            name = str(c.get("name", ""))
            return PodProblem("OOMKilled", f"container {name} was OOMKilled (exit code "
                              f"{term.get('exitCode', 137)})", OOM_FIX, name)
    creating = st.get("phase", "Pending") == "Pending" and all(
        w.get("reason") in ("ContainerCreating", "PodInitializing", None)
        for _, w, _ in _waiting(pod))
    warnings = [e for e in events if e.get("type") == "Warning"]
    if creating and warnings and warnings[-1].get("reason") in ("FailedMount",
                                                                "FailedAttachVolume"):
        ev = warnings[-1]
        return PodProblem(str(ev.get("reason")), str(ev.get("message", "")).strip(), MOUNT_FIX,
                          grace=MOUNT_GRACE)
    return None


#: where the monitoring role runs Prometheus and the DCGM exporter (gpu_monitoring)
MONITORING_NAMESPACE = "gpuk8s-monitoring"
#: Prometheus' instant-query API, through the API server's service proxy
PROMETHEUS_QUERY_PATH = (f"/api/v1/namespaces/{MONITORING_NAMESPACE}/services/"
                         "http:prometheus:9090/proxy/api/v1/query")


def prometheus_query(promql: str) -> str:
    """The kubectl command (after KUBECTL) that asks Prometheus an instant query (gpu-usage,
    verify)."""
    return (f"get --raw "
            f"{q(PROMETHEUS_QUERY_PATH + '?' + urllib.parse.urlencode({'query': promql}))}")
