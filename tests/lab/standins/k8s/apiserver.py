# LAB STAND-IN: not the real kube-apiserver. Test infrastructure for gpuk8s; never shipped to users.
"""kube-apiserver stand-in: HTTPS REST subset + the controllers a kubeadm cluster runs.

Started by the kubelet stand-in from /etc/kubernetes/manifests/kube-apiserver.yaml with the flags in
that manifest (python3 -m k8s.apiserver --advertise-address=... --secure-port=6443 ...).
Objects are kept in the REAL etcd of --etcd-servers (store.py), as kubeadm configures it.

The ServiceAccount admission plugin, the ServiceAccount and root CA publisher controllers, the
endpoint reconciler and the PersistentVolume binder's pre-bound case follow the upstream files
their docstrings name (kubernetes, read in recent upstream copies in the code index: the
v1.35.0 tag itself could not be fetched here, its snapshot being too large).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import datetime as dt
import hashlib
import hmac
import http.client
import ipaddress
import json
import os
import random
import re
import socket
import ssl
import sys
import threading
import time
import traceback
import urllib.parse
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import (
    admission,
    discovery,
    dra,
    dra_server,
    featuregates,
    merge,
    pki,
    quota,
    rbac,
    schema,
    svcproxy,
    tables,
    wire,
)
from .common import (
    API_ACCESS_PREFIX,
    MIRROR_ANNOTATION,
    TOKEN_MOUNT_PATH,
    P,
    api_access_volume,
    git_version,
    now,
    package_version,
    parse_quantity,
    parse_ts,
    pod_ready,
    rand_suffix,
    read,
    ts,
    yaml_load_all,
)
from .resources import Registry, Resource
from .scheduler import is_active, matches_node_selector, untolerated_taint
from .store import Conflict, Event, Store, StoreError

Obj = dict[str, Any]
NODE_GRACE = 40.0  # node-monitor-grace-period
#: what one request's handling leaves for its answer: "warnings" (admission's Warn action)
_REQUEST = threading.local()
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
DS_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
]


#: the root CA publisher's ConfigMap in every namespace, and its annotation
#: (pkg/controller/certificates/rootcacertpublisher/publisher.go)
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
ROOT_CA_DESCRIPTION = {"kubernetes.io/description": (
    "Contains a CA bundle that can be used to verify the kube-apiserver when using internal "
    "endpoints such as the internal service IP or kubernetes.default.svc. No other usage is "
    "guaranteed across distributions of Kubernetes clusters.")}
#: the endpoint reconciler's master leases (pkg/controlplane/reconcilers/lease.go: one key per
#: API server, /registry/masterleases/<ip> upstream, with an etcd lease of
#: DefaultEndpointReconcilerTTL; here an object with its renewal time), refreshed every
#: DefaultEndpointReconcilerInterval
MASTER_LEASES = ("", "masterleases")
MASTER_LEASE_TTL = 15.0
ENDPOINT_INTERVAL = 10.0


def _pod_secret_names(spec: Obj) -> list[str]:
    """The Secrets a pod spec names (pkg/api/pod VisitPodSecretNames: image pull secrets,
    secret and projected secret volumes, env and envFrom of every container)."""
    names = [s.get("name", "") for s in spec.get("imagePullSecrets") or []]
    for v in spec.get("volumes") or []:
        if "secret" in v:
            names.append(v["secret"].get("secretName", ""))
        names += [s["secret"].get("name", "") for s in (v.get("projected") or {}).get(
            "sources") or [] if "secret" in s]
    for group in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(group) or []:
            names += [e["secretRef"].get("name", "") for e in c.get("envFrom") or []
                      if "secretRef" in e]
            names += [e["valueFrom"]["secretKeyRef"].get("name", "") for e in c.get("env") or []
                      if "secretKeyRef" in (e.get("valueFrom") or {})]
    return [n for n in names if n]


def _claim_ref_names(ref: Obj | None, claim: Obj) -> bool:
    """persistentvolume util.go IsVolumeBoundToClaim: the claimRef names the claim's
    namespace and name, and its uid when it has one."""
    md = claim["metadata"]
    return bool(ref) and ref.get("name") == md.get("name") and \
        ref.get("namespace") == md.get("namespace") and \
        (not ref.get("uid") or ref.get("uid") == md.get("uid"))


def _volume_fits(pv: Obj, claim: Obj, compare_class: bool) -> bool:
    """Whether volume ``pv`` can hold ``claim``: not being deleted, its capacity at least the
    claim's request, the same volumeMode (Filesystem when unset), the claim's access modes
    among its own and, for a claim naming the volume, the same storage class (pv_controller.go
    checkVolumeSatisfyClaim; util.go FindMatchingVolume, CheckVolumeModeMismatches,
    CheckAccessModes)."""
    pspec, cspec = pv.get("spec") or {}, claim.get("spec") or {}
    if pv["metadata"].get("deletionTimestamp"):
        return False
    if parse_quantity((pspec.get("capacity") or {}).get("storage", "0")) < parse_quantity(
            ((cspec.get("resources") or {}).get("requests") or {}).get("storage", "0")):
        return False
    if (pspec.get("volumeMode") or "Filesystem") != (cspec.get("volumeMode") or "Filesystem"):
        return False
    if not set(cspec.get("accessModes") or []) <= set(pspec.get("accessModes") or []):
        return False
    return not compare_class or (pspec.get("storageClassName") or "") == (
        cspec.get("storageClassName") or "")


def _secret_string_data(res: Resource, obj: Obj) -> None:
    """Like the real API server: a Secret's stringData is merged into data (base64) on write
    and never stored."""
    if res.kind != "Secret" or "stringData" not in obj:
        return
    import base64

    data = obj.setdefault("data", {}) or {}
    for key, value in (obj.pop("stringData") or {}).items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    obj["data"] = data


class HTTPError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> Obj:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "details": self.details,
                "code": self.code}


SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
SUBDOMAIN_KINDS = {"configmaps", "secrets", "pods", "deployments", "daemonsets", "jobs",
                   "replicasets", "statefulsets", "persistentvolumeclaims", "persistentvolumes",
                   "serviceaccounts", "nodes", "runtimeclasses", "poddisruptionbudgets",
                   "cronjobs", "storageclasses", "priorityclasses"}


def name_error(res: Resource, name: str) -> str | None:
    """The real validation message of a bad metadata.name, or None."""
    if res.plural == "namespaces":
        if not LABEL_1123.match(name) or len(name) > 63:
            return ("a lowercase RFC 1123 label must consist of lower case alphanumeric "
                    "characters or '-', and must start and end with an alphanumeric character "
                    "(e.g. 'my-name',  or '123-abc', regex used for validation is "
                    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
    elif res.plural == "services":
        if not LABEL_1035.match(name) or len(name) > 63:
            return ("a DNS-1035 label must consist of lower case alphanumeric characters or "
                    "'-', start with an alphabetic character, and end with an alphanumeric "
                    "character (e.g. 'my-name',  or 'abc-123', regex used for validation is "
                    "'[a-z]([-a-z0-9]*[a-z0-9])?')")
    elif res.plural in SUBDOMAIN_KINDS and (not SUBDOMAIN.match(name) or len(name) > 253):
        return ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                "characters, '-' or '.', and must start and end with an alphanumeric character "
                "(e.g. 'example.com', regex used for validation is "
                "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
    return None


def invalid(res: Resource, name: str, field: str, value: str, why: str) -> HTTPError:
    detail = f'Invalid value: "{value}": {why}'
    return HTTPError(422, "Invalid", f'{res.kind} "{name}" is invalid: {field}: {detail}',
                     {"name": name, "group": res.group, "kind": res.kind, "causes": [
                         {"reason": "FieldValueInvalid", "message": detail, "field": field}]})


def not_found(res: Resource, name: str) -> HTTPError:
    return HTTPError(404, "NotFound", f'{res.qualified} "{name}" not found',
                     {"name": name, "group": res.group, "kind": res.plural})


def selector_match(selector: str, labels: dict[str, str]) -> bool:
    """Label selector string: a=b, a==b, a!=b, a, !a, a in (x,y), a notin (x,y)."""
    for term in re.findall(r"[^,(]+(?:\([^)]*\))?", selector or ""):
        term = term.strip()
        if not term:
            continue
        m = re.match(r"^([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)$", term)
        if m:
            vals = [v.strip() for v in m.group(3).split(",")]
            has = labels.get(m.group(1))
            if (m.group(2) == "in") != (has in vals):
                return False
            continue
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def match_labels(sel: Obj | None, labels: dict[str, str]) -> bool:
    """metav1.LabelSelector (matchLabels + matchExpressions)."""
    if not sel:
        return False
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in sel.get("matchExpressions") or []:
        has, vals = labels.get(e["key"]), e.get("values") or []
        op = e.get("operator")
        if (op == "In" and has not in vals) or (op == "NotIn" and has in vals) or (
                op == "Exists" and has is None) or (op == "DoesNotExist" and has is not None):
            return False
    return True


def field_value(obj: Obj, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def field_match(selector: str, obj: Obj) -> bool:
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if field_value(obj, k) == v:
                return False
        else:
            k, v = term.replace("==", "=").split("=", 1)
            if field_value(obj, k) != v:
                return False
    return True


#: the Lease the controllers' leader holds, and how long it lasts unrenewed
LEADER_LEASE = "kube-controller-manager"
LEASE_SECONDS = int(os.environ.get("GPUK8S_LAB_LEASE_SECONDS", "15"))
RENEW_SECONDS = 2
#: changes that do not wake the controllers early (await_change): heartbeats and events
QUIET_KEYS = frozenset({("coordination.k8s.io", "leases"), ("", "events"),
                        ("events.k8s.io", "events"), ("", "masterleases")})
#: seconds between two controller passes, however often the store changes
MIN_PASS_GAP = 0.1


def _node_gist(node: Obj) -> Any:
    """What of a Node the controllers act on: not the kubelet's heartbeat times."""
    st = node.get("status") or {}
    return (node["metadata"].get("labels"), node.get("spec"), st.get("allocatable"),
            [(c.get("type"), c.get("status")) for c in st.get("conditions") or []])


def stirs(e: Event) -> bool:
    """Whether a change may give the controllers work: not a heartbeat (a lease, a node
    status that only moved its times) nor an event."""
    if e.key in QUIET_KEYS:
        return False
    if e.key == ("", "nodes") and e.type == "MODIFIED" and e.old is not None:
        return bool(_node_gist(e.old) != _node_gist(e.obj))
    return True


def controller_manager_flags() -> dict[str, str]:
    """The --flags of the kube-controller-manager static pod on this (control plane) node."""
    docs = yaml_load_all(read("/etc/kubernetes/manifests/kube-controller-manager.yaml") or "")
    try:
        c = docs[0]["spec"]["containers"][0]
    except (IndexError, KeyError, TypeError):
        return {}
    out = {}
    for arg in [*(c.get("command") or []), *(c.get("args") or [])]:
        if arg.startswith("--") and "=" in arg:
            k, v = arg[2:].split("=", 1)
            out[k] = v
    return out


def node_ready(node: Obj) -> str:
    for c in node.get("status", {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return str(c.get("status"))
    return "Unknown"


def template_hash(tpl: Obj) -> str:
    return hashlib.sha256(json.dumps(tpl, sort_keys=True).encode()).hexdigest()[:10]


def _workload_defaults(res: Resource, obj: Obj) -> None:
    """The API server's defaults of a DaemonSet's update strategy (apps/v1 SetDefaults_DaemonSet:
    RollingUpdate, maxUnavailable 1, maxSurge 0; revisionHistoryLimit 10), which kubectl's
    rollout status reads."""
    if res.plural != "daemonsets":
        return
    spec = obj.setdefault("spec", {})
    strategy = spec.setdefault("updateStrategy", {})
    strategy.setdefault("type", "RollingUpdate")
    if strategy["type"] == "RollingUpdate":
        rolling = strategy.setdefault("rollingUpdate", {})
        rolling.setdefault("maxUnavailable", 1)
        rolling.setdefault("maxSurge", 0)
    spec.setdefault("revisionHistoryLimit", 10)


class ApiServer:
    def __init__(self, argv: list[str]) -> None:
        self.flags = self._parse_flags(argv)
        f = self.flags
        self.version = package_version(f.get("lab-version", ""))
        try:
            self.gates = featuregates.validate(featuregates.parse_flag(f.get("feature-gates", "")))
        except featuregates.GateError as e:
            sys.stderr.write(f'Error: invalid argument "{f.get("feature-gates")}" for '
                             f'"--feature-gates" flag: {e}\n')
            sys.exit(1)
        self.port = int(f.get("secure-port", "6443"))
        self.bind = f.get("bind-address", "0.0.0.0")
        self.advertise = f.get("advertise-address", "127.0.0.1")
        # node paths (GPUK8S_LAB_ROOT applies when they are opened)
        self.ca_file = f.get("client-ca-file", "/etc/kubernetes/pki/ca.crt")
        self.ca_key = os.path.join(os.path.dirname(self.ca_file), "ca.key")
        #: (group, plural) of served custom resources, and of those with a status subresource
        self.crd_resources: set[tuple[str, str]] = set()
        self.crd_status: set[tuple[str, str]] = set()
        self.sa_key_file = f.get("service-account-signing-key-file", "")
        self._sa_key: bytes | None = None
        self.registry = Registry()
        dra.gate(self.registry, self.version)  # resource.k8s.io/v1 from 1.34
        admission.register(self.registry)  # ValidatingAdmissionPolicy(Binding), GA in 1.30
        #: this server's controllers' identity in leader election (kube-controller-manager's
        #: is "<hostname>_<uuid>")
        self.identity = f"{socket.gethostname()}_{uuid.uuid4()}"
        # the REAL etcd kubeadm's static pod runs (the first of --etcd-servers), with the
        # client certificate kubeadm issued this API server
        self.store = Store(f.get("etcd-servers", "https://127.0.0.1:2379").split(",")[0],
                           ca=P(f["etcd-cafile"]) if f.get("etcd-cafile") else "",
                           cert=P(f["etcd-certfile"]) if f.get("etcd-certfile") else "",
                           key=P(f["etcd-keyfile"]) if f.get("etcd-keyfile") else "")
        self.lock = threading.RLock()
        self.started = time.time()
        self.svc_range = f.get("service-cluster-ip-range", "10.96.0.0/12")
        self._bootstrap()

    @staticmethod
    def _parse_flags(argv: list[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        it = iter(argv)
        for a in it:
            if a in ("kube-apiserver",):
                continue
            if a.startswith("--"):
                k, sep, v = a[2:].partition("=")
                out[k] = v if sep else "true"
        return out

    # ---------------------------------------------------------------- storage helpers
    def key(self, res: Resource) -> tuple[str, str]:
        return (res.group, res.plural)

    def res(self, api_version: str, kind: str) -> Resource:
        r = self.registry.by_kind(api_version, kind)
        if r is None:
            raise HTTPError(400, "BadRequest",
                            f'no matches for kind "{kind}" in version "{api_version}"')
        return r

    def get(self, res: Resource, ns: str, name: str) -> Obj | None:
        return self.store.get(self.key(res), ns if res.namespaced else "", name)

    def read(self, res: Resource, ns: str, name: str) -> Obj | None:
        """A client's read of one object: where the cache has none, once more after the cache
        caught up with etcd (Store.catch_up), so that an object another API server just
        wrote is found, as the real server's quorum read finds it."""
        obj = self.get(res, ns, name)
        if obj is None:
            try:
                self.store.catch_up()
            except StoreError:
                return None   # etcd away: the cache's answer stands
            obj = self.get(res, ns, name)
        return obj

    def list(self, res: Resource, ns: str | None = None,
             where: Callable[[Obj], bool] | None = None) -> list[Obj]:
        return self.store.list(self.key(res), ns if res.namespaced else None, where)

    def shared(self, res: Resource, ns: str | None = None) -> list[Obj]:
        """The stored objects themselves (Store.shared): only for code that never changes
        them."""
        return self.store.shared(self.key(res), ns if res.namespaced else None)

    def R(self, name: str) -> Resource:
        r = self.registry.lookup(name)
        assert r is not None, name
        return r

    def create(self, res: Resource, obj: Obj, ns: str = "", dry: bool = False,
               user: admission.UserInfo | None = None) -> Obj:
        """Store a new object; ``user``: a client's request, which admission checks (the
        server's own controllers write without)."""
        with self.lock:
            md = obj.setdefault("metadata", {})
            generated = not md.get("name") and bool(md.get("generateName"))
            if generated:
                md["name"] = md["generateName"] + rand_suffix()
            name = md.get("name")
            if not name:
                raise HTTPError(422, "Invalid", f"{res.kind} \"\" is invalid: metadata.name: "
                                "Required value: name or generateName is required")
            why = name_error(res, name)
            if why:
                raise invalid(res, name, "metadata.name", name, why)
            if res.namespaced:
                ns = md.get("namespace") or ns or "default"
                md["namespace"] = ns
                if res.plural != "events" and self.get(self.R("namespaces"), "", ns) is None:
                    raise HTTPError(404, "NotFound", f'namespaces "{ns}" not found',
                                    {"name": ns, "kind": "namespaces"})
            else:
                md.pop("namespace", None)
            if self.get(res, ns, name) is not None:
                raise HTTPError(409, "AlreadyExists", f'{res.qualified} "{name}" already exists',
                                {"name": name, "group": res.group, "kind": res.plural})
            obj["apiVersion"], obj["kind"] = res.api_version, res.kind
            md["uid"] = str(uuid.uuid4())
            md["creationTimestamp"] = ts()
            if "spec" in obj:
                md["generation"] = 1
            self._defaults(res, obj)
            if res.plural == "pods":
                self._service_account_admission(ns, obj, "" if generated else name)
                self._limit_and_quota(ns, obj)
            dra.admit(res, obj, HTTPError)
            _secret_string_data(res, obj)
            self.admit(user, "CREATE", res, ns, name, obj, None, "", dry)
            if dry:
                return obj
            out = self.store.put(self.key(res), obj)
            self._after_write(res, out)
            return out

    def update(self, res: Resource, obj: Obj, status_only: bool = False, dry: bool = False,
               status_metadata: bool = False, user: admission.UserInfo | None = None) -> Obj:
        with self.lock:
            md = obj["metadata"]
            old = self.get(res, md.get("namespace", ""), md["name"])
            if old is None:
                raise not_found(res, md["name"])
            obj["apiVersion"], obj["kind"] = res.api_version, res.kind
            for k in ("uid", "creationTimestamp"):
                md[k] = old["metadata"].get(k)
            if status_only:
                new = copy.deepcopy(old)
                new["status"] = obj.get("status", {})
                if "managedFields" in md:
                    new["metadata"]["managedFields"] = md["managedFields"]
                if status_metadata:
                    # a PATCH of nodes/<n>/status keeps its metadata changes (the node status
                    # strategy resets only the spec): flanneld annotates its node so
                    for k in ("annotations", "labels"):
                        if k in md:
                            new["metadata"][k] = md[k]
                obj = new
            else:
                dra.admit(res, obj, HTTPError)
                _workload_defaults(res, obj)
                if "status" in old and res.plural not in ("namespaces",):
                    obj["status"] = old["status"]
                if obj.get("spec") != old.get("spec"):
                    md["generation"] = old["metadata"].get("generation", 0) + 1
                else:
                    md["generation"] = old["metadata"].get("generation", 1)
            _secret_string_data(res, obj)
            self.admit(user, "UPDATE", res, md.get("namespace", ""), md["name"], obj, old,
                       "status" if status_only else "", dry)
            if dry:
                return obj
            out = self.store.put(self.key(res), obj)
            self._after_write(res, out)
            return out

    def delete(self, res: Resource, ns: str, name: str, dry: bool = False,
               user: admission.UserInfo | None = None) -> Obj:
        with self.lock:
            if user is not None or dry:
                old = self.get(res, ns, name)
                if old is None:
                    raise not_found(res, name)
                self.admit(user, "DELETE", res, ns, name, None, old, "", dry)
                if dry:
                    return old
            obj = self.store.delete(self.key(res), ns if res.namespaced else "", name)
            if obj is None:
                raise not_found(res, name)
            self._cascade(obj)
            if res.plural == "namespaces":
                for key in self.store.resource_keys():
                    for o in self.store.list(key, name):
                        self.store.delete(key, name, o["metadata"]["name"])
            if res.plural == "customresourcedefinitions":
                self._unregister_crd(obj)
            return obj

    def _cascade(self, owner: Obj) -> None:
        uid = owner["metadata"].get("uid")
        for key in self.store.resource_keys():
            for o in self.store.list(key):
                refs = o["metadata"].get("ownerReferences") or []
                if any(r.get("uid") == uid for r in refs):
                    self.store.delete(key, o["metadata"].get("namespace", ""),
                                      o["metadata"]["name"])
                    self._cascade(o)

    def _defaults(self, res: Resource, obj: Obj) -> None:
        md = obj["metadata"]
        _workload_defaults(res, obj)
        if res.plural == "namespaces":
            md.setdefault("labels", {})["kubernetes.io/metadata.name"] = md["name"]
            obj["spec"] = {"finalizers": ["kubernetes"]}
            obj["status"] = {"phase": "Active"}
        elif res.plural == "pods":
            spec = obj.setdefault("spec", {})
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            spec.setdefault("dnsPolicy", "ClusterFirst")
            spec.setdefault("priority", 0)
            tols = spec.setdefault("tolerations", [])
            for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
                if not any(t.get("key") == key for t in tols):
                    tols.append({"key": key, "operator": "Exists", "effect": "NoExecute",
                                 "tolerationSeconds": 300})
            st = obj.setdefault("status", {})
            st.setdefault("phase", "Pending")
            st.setdefault("qosClass", "BestEffort")
        elif res.plural == "services":
            spec = obj.setdefault("spec", {})
            spec.setdefault("type", "ClusterIP")
            if spec.get("clusterIP") != "None":
                spec.setdefault("clusterIP", self._alloc_cluster_ip())
            if spec["type"] in ("NodePort", "LoadBalancer"):
                used = {p.get("nodePort") for svc in self.list(self.R("services"))
                        for p in svc.get("spec", {}).get("ports") or []}
                free = (n for n in range(30000, 32768) if n not in used)
                for port in spec.get("ports") or []:
                    if not port.get("nodePort"):
                        port["nodePort"] = next(free)
        elif res.plural == "nodes":
            obj.setdefault("spec", {})
            obj.setdefault("status", {})
        elif res.plural == "customresourcedefinitions":
            obj["status"] = {"conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted"}],
                "acceptedNames": obj.get("spec", {}).get("names", {})}
        elif res.plural in ("deployments", "daemonsets", "jobs", "replicasets"):
            obj.setdefault("status", {})
            if res.plural == "jobs":
                spec = obj.setdefault("spec", {})
                spec.setdefault("completions", 1)
                spec.setdefault("parallelism", 1)
                spec.setdefault("backoffLimit", 6)
                spec.setdefault("completionMode", "NonIndexed")
                uidl = md["uid"]
                tpl_md = spec.setdefault("template", {}).setdefault("metadata", {})
                tpl_md.setdefault("labels", {}).update({
                    "batch.kubernetes.io/controller-uid": uidl,
                    "batch.kubernetes.io/job-name": md["name"],
                    "controller-uid": uidl, "job-name": md["name"]})
                spec.setdefault("selector", {"matchLabels": {
                    "batch.kubernetes.io/controller-uid": uidl}})
            if res.plural == "deployments":
                obj.setdefault("spec", {}).setdefault("replicas", 1)

    def _alloc_cluster_ip(self) -> str:
        import ipaddress

        net = ipaddress.ip_network(self.svc_range, strict=False)
        used = {s.get("spec", {}).get("clusterIP") for s in self.list(self.R("services"))}
        for i, host in enumerate(net.hosts()):
            if i == 0 and "kubernetes" not in [s["metadata"]["name"] for s in
                                               self.list(self.R("services"), "default")]:
                return str(host)
            if i > 0 and str(host) not in used:
                return str(host)
        return "None"

    def _service_account_admission(self, ns: str, pod: Obj, name: str) -> None:
        """The ServiceAccount admission plugin on a pod's create, a controller's pod
        included (plugin/pkg/admission/serviceaccount/admission.go, Admit and Validate):
        a mirror pod may reference no ServiceAccount, Secret or token projection and is left
        alone; any other pod gets serviceAccountName "default" when it names none, is refused
        when its ServiceAccount does not exist (getServiceAccount; the retries for "default"
        while the ServiceAccount controller has not made it yet are dispatch's,
        _await_default_service_account, outside the server's lock), gets the token volume
        kube-api-access-<5 characters> (TokenVolumeSource: a token of 3607 s, the
        kube-root-ca.crt ConfigMap's ca.crt, the namespace from the downward API; defaultMode
        0644) mounted read-only at /var/run/secrets/kubernetes.io/serviceaccount in every
        init container and container that mounts nothing there, unless
        automountServiceAccountToken is false (the pod's, else the ServiceAccount's:
        shouldAutomount), and the ServiceAccount's imagePullSecrets when it has none.
        ``name``: the pod's name as admission sees it ("" for a generateName pod: the real
        refusal then says ``pods is forbidden``, admission/errors.go NewForbidden)."""
        md, spec = pod["metadata"], pod.setdefault("spec", {})

        def forbidden(why: str) -> HTTPError:
            what = f'pods "{name}"' if name else "pods"
            return HTTPError(403, "Forbidden", f"{what} is forbidden: {why}",
                             {"name": name, "kind": "pods"})

        # the v1 conversion: the deprecated serviceAccount fills serviceAccountName
        if not spec.get("serviceAccountName") and spec.get("serviceAccount"):
            spec["serviceAccountName"] = spec["serviceAccount"]
        if MIRROR_ANNOTATION in (md.get("annotations") or {}):
            if spec.get("serviceAccountName"):
                raise forbidden("a mirror pod may not reference service accounts")
            if _pod_secret_names(spec):
                raise forbidden("a mirror pod may not reference secrets")
            if any("serviceAccountToken" in s for v in spec.get("volumes") or []
                   for s in (v.get("projected") or {}).get("sources") or []):
                raise forbidden("a mirror pod may not use ServiceAccountToken volume "
                                "projections")
            return
        sa_name = spec.get("serviceAccountName") or "default"
        spec["serviceAccountName"] = spec["serviceAccount"] = sa_name
        sa = self.read(self.R("serviceaccounts"), ns, sa_name)
        if sa is None:
            # getServiceAccount's errors.NewNotFound(api.Resource("serviceaccount"), name)
            raise forbidden(f'error looking up service account {ns}/{sa_name}: serviceaccount '
                            f'"{sa_name}" not found')
        automount = spec.get("automountServiceAccountToken")
        if automount is None:
            automount = sa.get("automountServiceAccountToken")
        if automount is not False:
            self._mount_service_account_token(pod)
        if not spec.get("imagePullSecrets") and sa.get("imagePullSecrets"):
            spec["imagePullSecrets"] = [{"name": s.get("name", "")}
                                        for s in sa["imagePullSecrets"]]

    @staticmethod
    def _mount_service_account_token(pod: Obj) -> None:
        """admission.go mountServiceAccountToken: the pod's kube-api-access-* volume (or a new
        one, named by common.api_access_volume) mounted in every container lacking a mount at
        the token path; the volume is added only when a container needed it."""
        spec = pod["spec"]
        have = next((v["name"] for v in spec.get("volumes") or []
                     if str(v.get("name", "")).startswith(API_ACCESS_PREFIX)), None)
        volume = have or api_access_volume(pod["metadata"]["uid"])
        needed = False
        for group in ("initContainers", "containers"):
            for c in spec.get(group) or []:
                mounts = c.setdefault("volumeMounts", [])
                if not any(m.get("mountPath") == TOKEN_MOUNT_PATH for m in mounts):
                    mounts.append({"name": volume, "readOnly": True,
                                   "mountPath": TOKEN_MOUNT_PATH})
                    needed = True
        if have is None and needed:
            spec.setdefault("volumes", []).append({"name": volume, "projected": {
                # TokenVolumeSource; DefaultMode set explicitly (kubernetes#104464)
                "defaultMode": 0o644, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": ROOT_CA_CONFIGMAP,
                                   "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                        "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}})

    def _await_default_service_account(self, ns: str, body: bytes,
                                       h: BaseHTTPRequestHandler) -> None:
        """admission.go getServiceAccount: a pod naming the "default" ServiceAccount, which
        the ServiceAccount controller makes a moment after its namespace, is looked up 10
        times, rand(100..200) ms apart, before it is refused. Here before the request takes
        the server's lock (the controllers, which make it, need that lock); create() then
        looks it up once more and refuses it if it is still missing."""
        try:
            if h.headers.get("Content-Type", "").startswith("application/apply-patch"):
                docs = yaml_load_all(body.decode())
                obj = docs[0] if docs and isinstance(docs[0], dict) else {}
            else:
                obj = self._decode(body, h)
        except Exception:  # create() reports a body it cannot read
            return
        md, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        if not isinstance(md, dict) or not isinstance(spec, dict) or \
                MIRROR_ANNOTATION in (md.get("annotations") or {}):
            return
        if (spec.get("serviceAccountName") or spec.get("serviceAccount") or
                "default") != "default":
            return
        ns = md.get("namespace") or ns or "default"
        if self.get(self.R("namespaces"), "", ns) is None:
            return  # NamespaceLifecycle refuses it first
        res, interval = self.R("serviceaccounts"), random.uniform(0.1, 0.2)
        for attempt in range(10):
            if attempt:
                time.sleep(interval)
            if self.read(res, ns, "default") is not None:
                return

    def _limit_and_quota(self, ns: str, pod: Obj) -> None:
        """The LimitRanger and ResourceQuota admission plugins (quota.py), which the real API
        server runs for every pod, a controller's included."""
        quota.apply_limit_ranges(pod, self.list(self.R("limitranges"), ns))
        quotas = self.list(self.R("resourcequotas"), ns)
        if quotas:
            refused = quota.check(pod, quotas, self.list(self.R("pods"), ns))
            if refused:
                raise HTTPError(403, "Forbidden", refused,
                                {"name": pod["metadata"]["name"], "kind": "pods"})

    def create_owned_pod(self, owner: Obj, pod: Obj) -> Obj | None:
        """A controller's pod; refused (a quota): the FailedCreate event the real
        ReplicaSet and Job controllers record on their object, and None."""
        try:
            return self.create(self.R("pods"), pod)
        except HTTPError as e:
            self.event(owner, "Warning", "FailedCreate", f"Error creating: {e.message}",
                       component=f"{owner['kind'].lower()}-controller")
            return None

    def quotas(self) -> None:
        quota.controller(lambda plural, ns: self.list(self.R(plural), ns),
                         lambda rq, st: self.update(self.R("resourcequotas"),
                                                    {**rq, "status": st}, status_only=True))

    def _after_write(self, res: Resource, obj: Obj) -> None:
        if res.plural == "customresourcedefinitions":
            self._register_crd(obj)

    def _register_crd(self, crd: Obj) -> None:
        spec = crd.get("spec", {})
        names = spec.get("names", {})
        for v in spec.get("versions") or []:
            sch = (v.get("schema") or {}).get("openAPIV3Schema")
            if sch:
                schema.CUSTOM[(spec.get("group", ""), v["name"], names.get("kind", ""))] = sch
            if v.get("served", True):
                key = (spec.get("group", ""), names.get("plural", ""))
                self.crd_resources.add(key)
                if "status" in (v.get("subresources") or {}):
                    self.crd_status.add(key)
                else:
                    self.crd_status.discard(key)
                self.registry.add(Resource(spec.get("group", ""), v["name"], names.get("kind", ""),
                                           names.get("plural", ""),
                                           spec.get("scope") == "Namespaced",
                                           tuple(names.get("shortNames") or ())))

    def _unregister_crd(self, crd: Obj) -> None:
        spec = crd.get("spec", {})
        self.registry.resources = [r for r in self.registry.resources if not (
            r.group == spec.get("group") and r.plural == spec.get("names", {}).get("plural"))]

    def _bootstrap(self) -> None:
        for crd in self.list(self.R("crd")):
            self._register_crd(crd)
        for ns in DEFAULT_NAMESPACES:
            if self.get(self.R("namespaces"), "", ns) is None:
                self.create(self.R("namespaces"), {"metadata": {"name": ns}})
        for role in quota.BOOTSTRAP_ROLES:
            if self.get(self.R("clusterroles"), "", role["metadata"]["name"]) is None:
                self.create(self.R("clusterroles"), copy.deepcopy(role))
        for binding in quota.BOOTSTRAP_BINDINGS:
            if self.get(self.R("clusterrolebindings"), "", binding["metadata"]["name"]) is None:
                self.create(self.R("clusterrolebindings"), copy.deepcopy(binding))
        if self.get(self.R("services"), "default", "kubernetes") is None:
            self.create(self.R("services"), {
                "metadata": {"name": "kubernetes", "namespace": "default",
                             "labels": {"component": "apiserver", "provider": "kubernetes"}},
                "spec": {"ports": [{"name": "https", "port": 443, "protocol": "TCP",
                                    "targetPort": self.port}]}})

    def event(self, obj: Obj, etype: str, reason: str, message: str,
              component: str = "default-scheduler", host: str = "") -> None:
        md = obj["metadata"]
        ns = md.get("namespace") or "default"
        ev_res = self.R("events")
        for ev in self.list(ev_res, ns):
            io = ev.get("involvedObject", {})
            if io.get("uid") == md.get("uid") and ev.get("reason") == reason and \
                    ev.get("message") == message:
                ev["count"] = ev.get("count", 1) + 1
                ev["lastTimestamp"] = ts()
                self.store.put(self.key(ev_res), ev)
                return
        src = {"component": component}
        if host:
            src["host"] = host
        self.create(ev_res, {
            "metadata": {"name": f"{md['name']}.{uuid.uuid4().hex[:16]}", "namespace": ns},
            "involvedObject": {"kind": obj.get("kind"), "namespace": md.get("namespace"),
                               "name": md["name"], "uid": md.get("uid"),
                               "apiVersion": obj.get("apiVersion")},
            "reason": reason, "message": message, "type": etype, "source": src,
            "firstTimestamp": ts(), "lastTimestamp": ts(), "count": 1,
            "reportingComponent": component, "reportingInstance": host})

    # ---------------------------------------------------------------- authn / authz
    def authenticate(self, handler: BaseHTTPRequestHandler) -> tuple[str, list[str]]:
        info = self.user_info(handler)
        return info.username, list(info.groups)

    def user_info(self, handler: BaseHTTPRequestHandler) -> admission.UserInfo:
        """Who the request acts as: its sender (_sender), or whom the sender impersonates."""
        sender = self._sender(handler)
        as_user = handler.headers.get("Impersonate-User")
        get_all = getattr(handler.headers, "get_all", None)  # a plain mapping in unit tests
        as_groups = (get_all("Impersonate-Group") if get_all else None) or []
        if not as_user:
            if as_groups:
                raise HTTPError(500, "InternalError", "requested [" + ", ".join(
                    f"{{Group  {g}  }}" for g in as_groups) + "] without impersonating a user")
            return sender
        return self._impersonated(sender, as_user, list(as_groups))

    def _impersonated(self, sender: admission.UserInfo, username: str,
                      groups: list[str]) -> admission.UserInfo:
        """The impersonation filter (staging/src/k8s.io/apiserver/pkg/endpoints/filters/
        impersonation.go), the subset the lab uses: ``kubectl --as USER [--as-group G]``. The
        sender must be allowed the verb impersonate on users (serviceaccounts for
        system:serviceaccount:NS:NAME, which then gets the ServiceAccount groups when none is
        given); here only the cluster's admins are (cluster-admin, system:masters), refused
        otherwise with upstream's text. A non-anonymous user also gets system:authenticated."""
        m = re.fullmatch(r"system:serviceaccount:([^:]+):([^:]+)", username)
        what = f'serviceaccounts "{m.group(2)}"' if m else f'users "{username}"'
        where = f'in the namespace "{m.group(1)}"' if m else "at the cluster scope"
        resource = "serviceaccounts" if m else "users"
        if not self.authorize(sender.username, list(sender.groups), "impersonate",
                              self.R("serviceaccounts") if m else None,
                              m.group(1) if m else "", m.group(2) if m else username, "") or \
                not self._is_admin(sender):
            raise HTTPError(403, "Forbidden", f'{what} is forbidden: User "{sender.username}" '
                            f'cannot impersonate resource "{resource}" in API group "" {where}',
                            {"name": m.group(2) if m else username, "kind": resource})
        if m and not groups:
            groups = ["system:serviceaccounts", f"system:serviceaccounts:{m.group(1)}"]
        if username != "system:anonymous" and "system:authenticated" not in groups:
            groups.append("system:authenticated")
        return admission.UserInfo(username, tuple(groups))

    def _is_admin(self, info: admission.UserInfo) -> bool:
        if "system:masters" in info.groups:
            return True
        return any(crb.get("roleRef", {}).get("name") == "cluster-admin" and any(
            (s.get("kind") == "Group" and s.get("name") in info.groups) or
            (s.get("kind") == "User" and s.get("name") == info.username)
            for s in crb.get("subjects") or [])
            for crb in self.shared(self.R("clusterrolebindings")))

    def _sender(self, handler: BaseHTTPRequestHandler) -> admission.UserInfo:
        """Who sends the request: a bootstrap token, a ServiceAccount token (with its uid and,
        bound to a pod, the pod's and its node's names in extra), a client certificate, or
        anonymous."""
        auth = handler.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            tok = auth[7:].strip()
            m = re.match(r"^([a-z0-9]{6})\.([a-z0-9]{16})$", tok)
            if m:
                sec = self.get(self.R("secrets"), "kube-system", f"bootstrap-token-{m.group(1)}")
                data = self._secret_data(sec) if sec else {}
                if data.get("token-secret") == m.group(2) and not self._token_expired(data) \
                        and data.get("usage-bootstrap-authentication") == "true":
                    groups = ["system:bootstrappers"] + [
                        g for g in data.get("auth-extra-groups", "").split(",") if g]
                    return admission.UserInfo(f"system:bootstrap:{m.group(1)}",
                                              (*groups, "system:authenticated"))
            sa_user = self.service_account_user(tok)
            if sa_user is not None:
                return sa_user
            raise HTTPError(401, "Unauthorized", "Unauthorized")
        cert = handler.request.getpeercert() if hasattr(handler.request, "getpeercert") else None
        if cert:
            cn, orgs = "", []
            for rdn in cert.get("subject", ()):
                for k, v in rdn:
                    if k == "commonName":
                        cn = v
                    elif k == "organizationName":
                        orgs.append(v)
            return admission.UserInfo(cn, (*orgs, "system:authenticated"))
        return admission.UserInfo("system:anonymous", ("system:unauthenticated",))

    def sa_key(self) -> bytes | None:
        """The key ServiceAccount tokens are signed with (from sa.key; None: no tokens)."""
        if self._sa_key is None and self.sa_key_file:
            with contextlib.suppress(OSError), open(P(self.sa_key_file), "rb") as fh:
                self._sa_key = rbac.signing_key(fh.read())
        return self._sa_key

    def service_account_user(self, token: str) -> admission.UserInfo | None:
        """The ServiceAccount a token names, while it, and the pod it is bound to, exist."""
        key = self.sa_key()
        c = rbac.claims(key, token) if key else None
        if c is None:
            return None
        k8s = c.get("kubernetes.io") or {}
        ns, sa_ref = k8s.get("namespace", ""), k8s.get("serviceaccount") or {}
        sa = self.get(self.R("serviceaccounts"), ns, sa_ref.get("name", ""))
        if sa is None or sa["metadata"].get("uid") != sa_ref.get("uid"):
            return None
        pod_ref = k8s.get("pod")
        if pod_ref:
            pod = self.get(self.R("pods"), ns, pod_ref.get("name", ""))
            if pod is None or pod["metadata"].get("uid") != pod_ref.get("uid"):
                return None
        user, groups = rbac.user_of(c)
        return admission.UserInfo(user, tuple(groups), sa_ref.get("uid", ""), rbac.extra_of(c))

    def admit(self, user: admission.UserInfo | None, operation: str, res: Resource, ns: str,
              name: str, obj: Obj | None, old: Obj | None, sub: str, dry: bool) -> None:
        """Validating admission of a client's write (admission.py): the ValidatingAdmission-
        Policies that match it, through their bindings; refused: the real Status."""
        if user is None:
            return
        self.node_restriction(user, operation, res, name, obj, old, sub)
        policies = self.list(self.R("validatingadmissionpolicies"))
        if not policies:
            return
        a = admission.Attributes(operation, res, name, ns if res.namespaced else "", obj, old,
                                 user, sub, dry)
        namespace = self.get(self.R("namespaces"), "", ns) if res.namespaced and ns else None
        try:
            warnings = admission.validate(
                policies, self.list(self.R("validatingadmissionpolicybindings")), a, namespace)
        except admission.Denied as e:
            raise HTTPError(e.code, e.reason, e.message, e.details) from None
        _REQUEST.__dict__.setdefault("warnings", []).extend(warnings)

    @staticmethod
    def node_restriction(user: admission.UserInfo, operation: str, res: Resource, name: str,
                         obj: Obj | None, old: Obj | None, sub: str) -> None:
        """The NodeRestriction admission plugin's rules for a kubelet's writes to Node objects
        that gpuk8s relies on (plugin/pkg/admission/noderestriction/admission.go, admitNode):
        a node may change only its own Node, and never its taints once it exists (it may
        cordon itself, and set its labels and annotations)."""
        if "system:nodes" not in user.groups or res.plural != "nodes" or sub:
            return
        node = user.username.removeprefix("system:node:")
        message = ""
        if operation in ("UPDATE", "DELETE") and name != node:
            message = f'node "{node}" is not allowed to modify node "{name}"'
        elif operation == "UPDATE" and ((obj or {}).get("spec") or {}).get("taints") != \
                ((old or {}).get("spec") or {}).get("taints"):
            message = f'node "{node}" is not allowed to modify taints'
        if message:
            raise HTTPError(403, "Forbidden", f'nodes "{name}" is forbidden: {message}',
                            {"name": name, "kind": "nodes"})

    def token_request(self, ns: str, name: str, body: bytes, h: BaseHTTPRequestHandler
                      ) -> Obj:
        """POST serviceaccounts/<name>/token (authentication.k8s.io/v1 TokenRequest)."""
        req = self._decode(body, h)
        sa = self.get(self.R("serviceaccounts"), ns, name)
        if sa is None:
            raise not_found(self.R("serviceaccounts"), name)
        key = self.sa_key()
        if key is None:
            raise HTTPError(404, "NotFound", "the server could not find the requested resource")
        spec = req.get("spec") or {}
        ref = spec.get("boundObjectRef") or {}
        pod = node = None
        if ref.get("kind") == "Pod":
            pod = self.get(self.R("pods"), ns, ref.get("name", ""))
            if pod is None or (ref.get("uid") and pod["metadata"].get("uid") != ref["uid"]):
                raise HTTPError(400, "BadRequest", f'cannot bind token for serviceaccount '
                                f'"{name}" to object of kind "Pod"')
            node_name = (pod.get("spec") or {}).get("nodeName")
            node = self.get(self.R("nodes"), "", node_name) if node_name else None
        token, exp = rbac.issue(key, ns, sa, int(spec.get("expirationSeconds") or 3600), pod,
                                node, spec.get("audiences") or ())
        return {"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"name": name, "namespace": ns, "creationTimestamp": None},
                "spec": {**spec, "audiences": spec.get("audiences") or [rbac.ISSUER]},
                "status": {"token": token, "expirationTimestamp": dt.datetime.fromtimestamp(
                    exp, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}}

    def authorize(self, user: str, groups: list[str], verb: str, res: Resource | None,
                  ns: str, name: str, sub: str) -> bool:
        if "system:masters" in groups:
            return True
        for crb in self.shared(self.R("clusterrolebindings")):
            if crb.get("roleRef", {}).get("name") != "cluster-admin":
                continue
            for s in crb.get("subjects") or []:
                if (s.get("kind") == "Group" and s.get("name") in groups) or (
                        s.get("kind") == "User" and s.get("name") == user):
                    return True
        plural = res.plural if res else ""
        if "system:nodes" in groups:
            if plural in ("nodes", "pods", "events", "leases", "certificatesigningrequests",
                          "resourceslices"):  # the node authorizer: its DRA drivers' slices
                return True
            if plural == "serviceaccounts" and sub == "token" and verb == "create":
                # the node authorizer: tokens of the ServiceAccounts of pods on this node
                node = user.removeprefix("system:node:")
                return any((p.get("spec") or {}).get("nodeName") == node and
                           (p.get("spec") or {}).get("serviceAccountName", "default") == name
                           for p in self.list(self.R("pods"), ns))
            return verb in ("get", "list", "watch")
        if "system:bootstrappers" in groups:
            if plural == "certificatesigningrequests" and verb in ("create", "get", "list"):
                return True
            if plural == "configmaps" and verb == "get" and ns == "kube-system" and name in (
                    "kubeadm-config", "kubelet-config", "kube-proxy"):
                return True
            if plural == "nodes" and verb == "get":
                return True
            # kubeadm's Role kubeadm:kubeadm-certs: joining control planes read the certs
            if plural == "secrets" and verb == "get" and ns == "kube-system" and \
                    name == "kubeadm-certs":
                return True
        if plural == "configmaps" and verb == "get" and ns == "kube-public" and \
                name == "cluster-info":
            return True
        if res is None:
            return False
        return rbac.allows(
            user, groups, verb, res.group, f"{plural}/{sub}" if sub else plural, ns, name,
            lambda scope: self.shared(self.R("clusterrolebindings")) if scope is None else
            self.shared(self.R("rolebindings"), scope),
            lambda kind, scope, rname: self.get(self.R("clusterroles"), "", rname)
            if kind == "ClusterRole" else self.get(self.R("roles"), scope, rname))

    @staticmethod
    def _secret_data(sec: Obj) -> dict[str, str]:
        out = dict(sec.get("stringData") or {})
        for k, v in (sec.get("data") or {}).items():
            try:
                out[k] = base64.b64decode(v).decode()
            except ValueError:
                continue
        return out

    @staticmethod
    def _token_expired(data: dict[str, str]) -> bool:
        exp = data.get("expiration")
        return bool(exp) and parse_ts(exp) <= now()

    # ---------------------------------------------------------------- controllers
    def lead(self, now_: dt.datetime | None = None) -> bool:
        """Leader election as kube-controller-manager does it: hold (or take over, once its
        holder stopped renewing it for leaseDurationSeconds) the Lease
        kube-system/kube-controller-manager. Only the holder's controllers run, so API servers
        sharing one etcd (control planes of one cluster) never run them twice."""
        t = now_ or dt.datetime.now(dt.UTC)
        micro = t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        lease = self.get(self.R("leases"), "kube-system", LEADER_LEASE)
        spec = (lease or {}).get("spec") or {}
        holder = spec.get("holderIdentity")
        try:
            renewed: dt.datetime | None = dt.datetime.strptime(
                spec.get("renewTime", ""), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
        except ValueError:
            renewed = None
        if lease is not None and renewed is not None:
            if holder == self.identity and t < renewed + dt.timedelta(seconds=RENEW_SECONDS):
                return True  # renewed a moment ago (the real one retries every 2 s)
            if holder != self.identity and t < renewed + dt.timedelta(
                    seconds=int(spec.get("leaseDurationSeconds") or LEASE_SECONDS)):
                return False
        new = lease or {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": LEADER_LEASE, "namespace": "kube-system",
                                     "uid": str(uuid.uuid4()), "creationTimestamp": ts()}}
        took = holder != self.identity
        new["spec"] = {"holderIdentity": self.identity, "leaseDurationSeconds": LEASE_SECONDS,
                       "acquireTime": micro if took else spec.get("acquireTime", micro),
                       "renewTime": micro,
                       "leaseTransitions": int(spec.get("leaseTransitions") or 0)
                       + (1 if took and lease is not None else 0)}
        try:
            self.store.put(self.key(self.R("leases")), new)
        except (Conflict, StoreError):
            return False  # another API server renewed or took it first, or etcd is away
        if took:
            sys.stderr.write(f"leaderelection.go:268] successfully acquired lease "
                             f"kube-system/{LEADER_LEASE}\n")
        return True

    def controllers(self) -> None:
        sys.stderr.write(f"leaderelection.go:257] attempting to acquire leader lease "
                         f"kube-system/{LEADER_LEASE} as {self.identity}...\n")
        while True:
            if not self.lead():
                time.sleep(float(os.environ.get("GPUK8S_LAB_CONTROLLER_PERIOD", "1")))
                continue
            # the ServiceAccount controller and the root CA publisher first: a namespace's
            # "default" ServiceAccount and kube-root-ca.crt are there before this pass's
            # controllers make pods in it (upstream they follow the namespace within moments)
            for step in (self.service_accounts, self.root_ca_publisher,
                         self.token_cleaner, self.bootstrap_signer, self.csr_signer,
                         self.node_lifecycle, self.node_ipam, self.daemonsets,
                         self.deployments, self.replicasets, self.jobs, self.pv_binder,
                         self.quotas,
                         lambda: dra_server.claims_controller(self),
                         self.scheduler, self.pod_gc, self.disruption):
                try:
                    with self.lock:
                        step()
                except Exception:  # keep the loop alive like a real controller manager
                    traceback.print_exc()
            with self.store.lock:
                seen = self.store.rv  # the pass's own writes are in (a write waits for them)
            time.sleep(MIN_PASS_GAP)
            self.await_change(seen, float(os.environ.get("GPUK8S_LAB_CONTROLLER_PERIOD", "1"))
                              - MIN_PASS_GAP)

    def await_change(self, seen: int, timeout: float) -> None:
        """Return when the store has a change after revision ``seen`` that a controller may
        act on, or after ``timeout`` seconds: the real controllers are driven by their
        informers' events; the lab's pass over everything runs on the next change, not on a
        clock. Heartbeats (leases, node statuses that only moved their times) and events do not
        count: eight kubelets post them all the time."""
        deadline = time.monotonic() + timeout
        with self.store.lock:
            while True:
                for e in reversed(self.store.history):
                    if e.rv <= seen:
                        break
                    if stirs(e):
                        return
                seen = self.store.rv
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self.store.changed.wait(left)

    def _active_namespaces(self) -> list[str]:
        return [ns["metadata"]["name"] for ns in self.shared(self.R("namespaces"))
                if (ns.get("status") or {}).get("phase", "Active") == "Active"]

    def service_accounts(self) -> None:
        """kube-controller-manager's ServiceAccount controller
        (pkg/controller/serviceaccount/serviceaccounts_controller.go syncNamespace, with
        DefaultServiceAccountsControllerOptions): the ServiceAccount "default" in every active
        namespace, made again when it is deleted; an AlreadyExists is no failure."""
        res = self.R("serviceaccounts")
        for ns in self._active_namespaces():
            if self.get(res, ns, "default") is None:
                with contextlib.suppress(HTTPError):
                    self.create(res, {"metadata": {"name": "default", "namespace": ns}})

    def root_ca(self) -> str | None:
        """The CA bundle the root CA publisher publishes: kube-controller-manager's
        --root-ca-file (kubeadm: /etc/kubernetes/pki/ca.crt) from its static pod on this
        node, else this API server's --client-ca-file (the same file under kubeadm); read
        once, as the controller manager reads it at its start."""
        if getattr(self, "_root_ca", None) is None:
            path = controller_manager_flags().get("root-ca-file") or self.ca_file
            self._root_ca = read(path)
        return self._root_ca

    def root_ca_publisher(self) -> None:
        """kube-controller-manager's root CA publisher
        (pkg/controller/certificates/rootcacertpublisher/publisher.go syncNamespace): the
        ConfigMap kube-root-ca.crt in every namespace, data ca.crt = the cluster CA and the
        kubernetes.io/description annotation; made when missing (or deleted), its data and
        annotation put back when they differ."""
        ca = self.root_ca()
        if not ca:
            return
        res, data = self.R("configmaps"), {"ca.crt": ca}
        for ns in self._active_namespaces():
            cm = self.get(res, ns, ROOT_CA_CONFIGMAP)
            with contextlib.suppress(HTTPError):
                if cm is None:
                    self.create(res, {"metadata": {"name": ROOT_CA_CONFIGMAP, "namespace": ns,
                                                   "annotations": dict(ROOT_CA_DESCRIPTION)},
                                      "data": data})
                elif cm.get("data") != data or not (cm["metadata"].get("annotations") or {}
                                                    ).get("kubernetes.io/description"):
                    cm["data"] = data
                    cm["metadata"].setdefault("annotations", {}).update(ROOT_CA_DESCRIPTION)
                    cm["metadata"].pop("resourceVersion", None)
                    self.update(res, cm)

    def reconcile_endpoints(self) -> None:
        """The API server's endpoint reconciler (--endpoint-reconciler-type=lease, the default:
        pkg/controlplane/reconcilers/lease.go ReconcileEndpoints/doReconcile): renew this
        server's master lease (its --advertise-address), then make the Endpoints
        default/kubernetes list the addresses of every server whose lease has not expired,
        sorted, on port "https" = --secure-port (createEndpointPortSpec), labelled
        endpointslice.kubernetes.io/skip-mirror=true; written only when it differs. Runs in
        every API server, not only the controllers' leader. Not played: the EndpointSlice
        default/kubernetes (the lab serves no discovery.k8s.io)."""
        now_ = time.time()
        with self.lock:
            self.store.put(MASTER_LEASES, {"metadata": {"name": self.advertise},
                                           "renewTime": now_, "ttlSeconds": MASTER_LEASE_TTL})
            ips = []
            for lease in self.store.list(MASTER_LEASES):
                if float(lease.get("renewTime") or 0) + float(
                        lease.get("ttlSeconds") or MASTER_LEASE_TTL) > now_:
                    ips.append(lease["metadata"]["name"])
                else:  # etcd's lease TTL upstream: the key of a server gone goes
                    with contextlib.suppress(StoreError):
                        self.store.delete(MASTER_LEASES, "", lease["metadata"]["name"])
            if not ips:  # "refusing to erase all endpoints for the kubernetes Service"
                return
            subsets = [{"addresses": [{"ip": ip} for ip in sorted(ips)],
                        "ports": [{"name": "https", "port": self.port, "protocol": "TCP"}]}]
            res = self.R("endpoints")
            ep = self.get(res, "default", "kubernetes")
            labels = {"endpointslice.kubernetes.io/skip-mirror": "true"}
            if ep is None:
                self.create(res, {"metadata": {"name": "kubernetes", "namespace": "default",
                                               "labels": labels}, "subsets": subsets})
            elif ep.get("subsets") != subsets or \
                    not labels.items() <= (ep["metadata"].get("labels") or {}).items():
                ep["subsets"] = subsets
                ep["metadata"].setdefault("labels", {}).update(labels)
                ep["metadata"].pop("resourceVersion", None)
                self.update(res, ep)

    def endpoint_reconciler(self) -> None:
        while True:
            try:
                self.reconcile_endpoints()
            except Exception:  # keep reconciling, as the real loop (wait.NonSlidingUntil)
                traceback.print_exc()
            time.sleep(ENDPOINT_INTERVAL)

    def token_cleaner(self) -> None:
        for sec in self.list(self.R("secrets"), "kube-system"):
            if sec.get("type") == "bootstrap.kubernetes.io/token" and \
                    self._token_expired(self._secret_data(sec)):
                self.store.delete(self.key(self.R("secrets")), "kube-system",
                                  sec["metadata"]["name"])

    def bootstrap_signer(self) -> None:
        cm = self.get(self.R("configmaps"), "kube-public", "cluster-info")
        if cm is None:
            return
        data = cm.setdefault("data", {})
        kc = data.get("kubeconfig", "")
        want: dict[str, str] = {}
        for sec in self.list(self.R("secrets"), "kube-system"):
            if sec.get("type") != "bootstrap.kubernetes.io/token":
                continue
            d = self._secret_data(sec)
            if d.get("usage-bootstrap-signing") != "true" or self._token_expired(d):
                continue
            want[f"jws-kubeconfig-{d.get('token-id')}"] = jws_detached(
                kc, f"{d.get('token-id')}.{d.get('token-secret')}")
        have = {k: v for k, v in data.items() if k.startswith("jws-kubeconfig-")}
        if have != want:
            cm["data"] = {**{k: v for k, v in data.items() if not k.startswith("jws-")}, **want}
            self.store.put(self.key(self.R("configmaps")), cm)

    def csr_signer(self) -> None:
        res = self.R("csr")
        for csr in self.list(res):
            st = csr.setdefault("status", {})
            if st.get("certificate"):
                continue
            spec = csr.get("spec", {})
            if spec.get("signerName") not in ("kubernetes.io/kube-apiserver-client-kubelet",):
                continue
            if not any(g in ("system:bootstrappers", "system:nodes")
                       for g in spec.get("groups") or []):
                continue
            pem = base64.b64decode(spec.get("request", "")).decode()
            subj = pki.csr_subject(pem)
            if "O=system:nodes" not in subj or "CN=system:node:" not in subj:
                st["conditions"] = [{"type": "Denied", "status": "True",
                                     "reason": "AutoDenied", "message": subj}]
            else:
                cert = pki.sign_csr(pem, self.ca_file, self.ca_key, client=True)
                st["conditions"] = [{"type": "Approved", "status": "True",
                                     "reason": "AutoApproved",
                                     "message": "Auto approving kubelet client certificate "
                                                "after SubjectAccessReview."}]
                st["certificate"] = base64.b64encode(cert.encode()).decode()
            self.store.put(self.key(res), csr)

    def node_lifecycle(self) -> None:
        res = self.R("nodes")
        for node in self.list(res):
            st = node.setdefault("status", {})
            conds = st.setdefault("conditions", [])
            ready = next((c for c in conds if c.get("type") == "Ready"), None)
            changed = False
            if ready is not None and ready.get("status") != "Unknown":
                hb = ready.get("lastHeartbeatTime")
                if hb and (now() - parse_ts(hb)).total_seconds() > NODE_GRACE:
                    for c in conds:
                        if c.get("type") in ("Ready", "MemoryPressure", "DiskPressure",
                                             "PIDPressure"):
                            c.update({"status": "Unknown", "reason": "NodeStatusUnknown",
                                      "message": "Kubelet stopped posting node status.",
                                      "lastTransitionTime": ts()})
                    changed = True
            status = node_ready(node)
            want_taint = {"True": None, "False": "node.kubernetes.io/not-ready",
                          "Unknown": "node.kubernetes.io/unreachable"}.get(status)
            if not conds:
                want_taint = "node.kubernetes.io/not-ready"
            spec = node.setdefault("spec", {})
            taints = spec.get("taints") or []
            lifecycle = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
            new = [t for t in taints if t.get("key") not in lifecycle or (
                t.get("key") == want_taint)]
            if want_taint and not any(t.get("key") == want_taint and t.get("effect") ==
                                      "NoSchedule" for t in new):
                new.append({"key": want_taint, "effect": "NoSchedule"})
            if new != taints:
                spec["taints"] = new
                changed = True
            if not new:
                spec.pop("taints", None)
            if changed:
                self.store.put(self.key(res), node)

    def node_ipam(self) -> None:
        """kube-controller-manager's node IPAM (range allocator): with --allocate-node-cidrs,
        each node gets the next free /--node-cidr-mask-size (24) of --cluster-cidr as its
        spec.podCIDR(s), read from the controller manager's static pod manifest on this node."""
        flags = controller_manager_flags()
        if flags.get("allocate-node-cidrs") != "true" or not flags.get("cluster-cidr"):
            return
        cluster = ipaddress.ip_network(flags["cluster-cidr"].split(",")[0], strict=False)
        size = int(flags.get("node-cidr-mask-size-ipv4") or flags.get("node-cidr-mask-size")
                   or 24)
        res = self.R("nodes")
        nodes = self.list(res)
        taken = {n.get("spec", {}).get("podCIDR") for n in nodes}
        free = (str(s) for s in cluster.subnets(new_prefix=size) if str(s) not in taken)
        for node in sorted(nodes, key=lambda n: n["metadata"].get("creationTimestamp", "")):
            spec = node.setdefault("spec", {})
            if spec.get("podCIDR"):
                continue
            cidr = next(free, None)
            if cidr is None:  # the real allocator reports CIDRNotAvailable
                return
            spec["podCIDR"], spec["podCIDRs"] = cidr, [cidr]
            self.store.put(self.key(res), node)

    def _owned(self, owner: Obj, pods: list[Obj]) -> list[Obj]:
        uid = owner["metadata"]["uid"]
        return [p for p in pods if any(r.get("uid") == uid for r in
                                       p["metadata"].get("ownerReferences") or [])]

    @staticmethod
    def _owner_ref(owner: Obj) -> Obj:
        return {"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
                "controller": True, "blockOwnerDeletion": True}

    def _pod_from_template(self, owner: Obj, tpl: Obj, name: str) -> Obj:
        pod = copy.deepcopy(tpl)
        md = pod.setdefault("metadata", {})
        md["name"] = name
        md["namespace"] = owner["metadata"]["namespace"]
        md["ownerReferences"] = [self._owner_ref(owner)]
        pod.setdefault("spec", {})
        return pod

    def daemonsets(self) -> None:
        pods_res, ds_res = self.R("pods"), self.R("daemonsets")
        nodes = self.list(self.R("nodes"))
        for ds in self.list(ds_res):
            ns = ds["metadata"]["namespace"]
            tpl = ds.get("spec", {}).get("template", {})
            owned = self._owned(ds, self.list(pods_res, ns))
            by_node = {p["spec"].get("affinity", {}).get("nodeAffinity", {}).get(
                "requiredDuringSchedulingIgnoredDuringExecution", {}).get(
                "nodeSelectorTerms", [{}])[0].get("matchFields", [{}])[0].get("values", [""])[0]:
                p for p in owned}
            probe = {"spec": {**tpl.get("spec", {}), "tolerations": [
                *(tpl.get("spec", {}).get("tolerations") or []), *DS_TOLERATIONS]}}
            eligible = []
            for n in nodes:
                if untolerated_taint(probe, n) is None and matches_node_selector(probe, n):
                    eligible.append(n["metadata"]["name"])
            for nn in eligible:
                if nn in by_node:
                    continue
                pod = self._pod_from_template(ds, tpl, f"{ds['metadata']['name']}-{rand_suffix()}")
                pod["metadata"].setdefault("labels", {})["controller-revision-hash"] = \
                    template_hash(tpl)
                spec = pod["spec"]
                spec["tolerations"] = probe["spec"]["tolerations"]
                spec["affinity"] = {"nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In",
                                          "values": [nn]}]}]}}}
                self.create(pods_res, pod)
                self.event(ds, "Normal", "SuccessfulCreate",
                           f"Created pod: {pod['metadata']['name']}", "daemonset-controller")
            names = {n["metadata"]["name"] for n in nodes}
            for nn, p in by_node.items():
                if nn in eligible:
                    continue
                if nn not in names:   # the node is gone: the pod GC deletes its pods at once
                    self.store.delete(self.key(pods_res), ns, p["metadata"]["name"])
                elif not p["metadata"].get("deletionTimestamp"):
                    # graceful: the pod shows Terminating until its kubelet has stopped it
                    p["metadata"]["deletionTimestamp"] = ts()
                    p["metadata"]["deletionGracePeriodSeconds"] = 30
                    self.store.put(self.key(pods_res), p)
            self._roll(ds, tpl, by_node, eligible)
            owned = self._owned(ds, self.list(pods_res, ns))
            scheduled = [p for p in owned if p["spec"].get("nodeName")]
            ready = [p for p in owned if pod_ready(p)]
            current = template_hash(tpl)
            updated = [p for p in scheduled
                       if p["metadata"].get("labels", {}).get("controller-revision-hash") ==
                       current]
            status = {"desiredNumberScheduled": len(eligible),
                      "currentNumberScheduled": len(scheduled),
                      "updatedNumberScheduled": len(updated),
                      "numberReady": len(ready), "numberAvailable": len(ready),
                      "numberMisscheduled": 0,
                      "observedGeneration": ds["metadata"].get("generation", 1)}
            if len(eligible) - len(ready):
                status["numberUnavailable"] = len(eligible) - len(ready)
            if ds.get("status") != status:
                ds["status"] = status
                self.store.put(self.key(ds_res), ds)

    def _roll(self, ds: Obj, tpl: Obj, by_node: dict[str, Obj], eligible: list[str]) -> None:
        """RollingUpdate (the default strategy): pods of an older template are deleted
        (gracefully), those not available first and at once, the available ones while no more
        than maxUnavailable (default 1, or a percentage) of the nodes lack an available pod;
        the loop above then creates the new pods."""
        strategy = (ds.get("spec") or {}).get("updateStrategy") or {}
        if strategy.get("type", "RollingUpdate") != "RollingUpdate":
            return  # OnDelete: replaced only when someone deletes them
        current = template_hash(tpl)
        raw = str((strategy.get("rollingUpdate") or {}).get("maxUnavailable", 1))
        limit = max(1, len(eligible) * int(raw[:-1]) // 100) if raw.endswith("%") else \
            max(1, int(raw) if raw.isdigit() else 1)
        pods_res = self.R("pods")
        old = [p for nn, p in by_node.items() if nn in eligible and
               p["metadata"].get("labels", {}).get("controller-revision-hash") != current and
               not p["metadata"].get("deletionTimestamp")]
        unavailable = sum(1 for nn in eligible if nn not in by_node or
                          by_node[nn]["metadata"].get("deletionTimestamp") or
                          not pod_ready(by_node[nn]))
        for p in sorted(old, key=pod_ready):  # not-ready ones first
            if pod_ready(p):
                if unavailable >= limit:
                    break
                unavailable += 1
            p["metadata"]["deletionTimestamp"] = ts()
            p["metadata"]["deletionGracePeriodSeconds"] = 30
            self.store.put(self.key(pods_res), p)

    def deployments(self) -> None:
        rs_res, d_res = self.R("replicasets"), self.R("deployments")
        for d in self.list(d_res):
            ns = d["metadata"]["namespace"]
            tpl = d.get("spec", {}).get("template", {})
            h = template_hash(tpl)
            rs_name = f"{d['metadata']['name']}-{h}"
            owned = self._owned(d, self.list(rs_res, ns))
            for rs in owned:
                if rs["metadata"]["name"] != rs_name:
                    self.delete(rs_res, ns, rs["metadata"]["name"])
            rs = self.get(rs_res, ns, rs_name)
            replicas = d.get("spec", {}).get("replicas", 1)
            if rs is None:
                tpl2 = copy.deepcopy(tpl)
                tpl2.setdefault("metadata", {}).setdefault("labels", {})["pod-template-hash"] = h
                sel = copy.deepcopy(d["spec"].get("selector") or {})
                sel.setdefault("matchLabels", {})["pod-template-hash"] = h
                rs = self.create(rs_res, {"metadata": {
                    "name": rs_name, "namespace": ns, "labels": tpl2["metadata"]["labels"],
                    "ownerReferences": [self._owner_ref(d)]},
                    "spec": {"replicas": replicas, "selector": sel, "template": tpl2}})
            elif rs["spec"].get("replicas") != replicas:
                rs["spec"]["replicas"] = replicas
                rs = self.update(rs_res, rs)
            rst = rs.get("status", {})
            ready = rst.get("readyReplicas", 0)
            status = {"observedGeneration": d["metadata"].get("generation", 1),
                      "replicas": rst.get("replicas", 0), "updatedReplicas": rst.get("replicas", 0),
                      "readyReplicas": ready, "availableReplicas": ready,
                      "conditions": [{"type": "Available",
                                      "status": "True" if ready >= replicas else "False",
                                      "reason": "MinimumReplicasAvailable" if ready >= replicas
                                      else "MinimumReplicasUnavailable"}]}
            if ready < replicas:
                status["unavailableReplicas"] = replicas - ready
            if not ready:
                status.pop("readyReplicas")
                status.pop("availableReplicas")
            if d.get("status") != status:
                d["status"] = status
                self.store.put(self.key(d_res), d)

    def replicasets(self) -> None:
        pods_res, rs_res = self.R("pods"), self.R("replicasets")
        for rs in self.list(rs_res):
            ns = rs["metadata"]["namespace"]
            owned = [p for p in self._owned(rs, self.list(pods_res, ns)) if is_active(p)]
            want = rs.get("spec", {}).get("replicas", 1)
            for _ in range(want - len(owned)):
                name = f"{rs['metadata']['name']}-{rand_suffix()}"
                self.create_owned_pod(rs, self._pod_from_template(
                    rs, rs["spec"].get("template", {}), name))
            for p in owned[want:]:
                self.store.delete(self.key(pods_res), ns, p["metadata"]["name"])
            owned = [p for p in self._owned(rs, self.list(pods_res, ns)) if is_active(p)]
            status = {"replicas": len(owned), "observedGeneration": rs["metadata"].get(
                "generation", 1), "readyReplicas": sum(pod_ready(p) for p in owned)}
            status["availableReplicas"] = status["readyReplicas"]
            if rs.get("status") != status:
                rs["status"] = status
                self.store.put(self.key(rs_res), rs)

    def jobs(self) -> None:
        pods_res, job_res = self.R("pods"), self.R("jobs")
        for job in self.list(job_res):
            spec, st = job.get("spec", {}), job.setdefault("status", {})
            if any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                   for c in st.get("conditions") or []):
                continue
            ns, jname = job["metadata"]["namespace"], job["metadata"]["name"]
            owned = self._owned(job, self.list(pods_res, ns))
            completions, parallelism = spec.get("completions", 1), spec.get("parallelism", 1)
            indexed = spec.get("completionMode") == "Indexed"
            succeeded = [p for p in owned if p["status"].get("phase") == "Succeeded"]
            failed = [p for p in owned if p["status"].get("phase") == "Failed"]
            active = [p for p in owned if is_active(p)]
            idx_of = lambda p: p["metadata"].get("annotations", {}).get(  # noqa: E731
                "batch.kubernetes.io/job-completion-index")
            done_idx = {idx_of(p) for p in succeeded}
            new_st: Obj = {"active": len(active), "succeeded": len(succeeded) if not indexed else
                           len(done_idx), "failed": len(failed), "ready": sum(
                               pod_ready(p) for p in active),
                           "startTime": st.get("startTime") or ts()}
            if indexed:
                new_st["completedIndexes"] = ",".join(sorted(i for i in done_idx if i))
            if len(failed) > spec.get("backoffLimit", 6):
                new_st["conditions"] = [
                    {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded",
                     "message": "Job has reached the specified backoff limit"},
                    {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                     "message": "Job has reached the specified backoff limit"}]
                for p in active:
                    self.store.delete(self.key(pods_res), ns, p["metadata"]["name"])
                self.event(job, "Warning", "BackoffLimitExceeded",
                           "Job has reached the specified backoff limit", "job-controller")
            elif new_st["succeeded"] >= completions:
                new_st["conditions"] = [
                    {"type": "SuccessCriteriaMet", "status": "True",
                     "reason": "CompletionsReached", "message": "Reached expected number of "
                     "succeeded pods", "lastTransitionTime": ts()},
                    {"type": "Complete", "status": "True", "reason": "CompletionsReached",
                     "message": "Reached expected number of succeeded pods",
                     "lastTransitionTime": ts()}]
                new_st["completionTime"] = ts()
                new_st.pop("ready")
                self.event(job, "Normal", "Completed", "Job completed", "job-controller")
            else:
                tpl = spec.get("template", {})
                if indexed:
                    busy = {idx_of(p) for p in active} | done_idx
                    todo = [str(i) for i in range(completions) if str(i) not in busy]
                else:
                    todo = [None] * max(0, completions - len(succeeded) - len(active))
                for idx in todo[: max(0, parallelism - len(active))]:
                    name = f"{jname}-{idx}-{rand_suffix()}" if idx else f"{jname}-{rand_suffix()}"
                    pod = self._pod_from_template(job, tpl, name)
                    if spec.get("template", {}).get("spec", {}).get("restartPolicy") is None:
                        pod["spec"]["restartPolicy"] = "Never"
                    if idx is not None:
                        pod["metadata"].setdefault("annotations", {})[
                            "batch.kubernetes.io/job-completion-index"] = idx
                        pod["metadata"].setdefault("labels", {})[
                            "batch.kubernetes.io/job-completion-index"] = idx
                        pod["spec"].setdefault("hostname", f"{jname}-{idx}")
                        if spec.get("template", {}).get("spec", {}).get("subdomain"):
                            pod["spec"]["subdomain"] = spec["template"]["spec"]["subdomain"]
                        for c in pod["spec"].get("containers") or []:
                            c.setdefault("env", []).append(
                                {"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
                                    "fieldPath": "metadata.annotations['batch.kubernetes.io/"
                                                 "job-completion-index']"}}})
                    if self.create_owned_pod(job, pod) is not None:
                        self.event(job, "Normal", "SuccessfulCreate",
                                   f"Created pod: {name}", "job-controller")
                    new_st["active"] += 1
                if st.get("conditions"):
                    new_st["conditions"] = st["conditions"]
            if not new_st.get("failed"):
                new_st.pop("failed", None)
            if not new_st.get("active"):
                new_st.pop("active", None)
            if new_st != st:
                job["status"] = new_st
                self.store.put(self.key(job_res), job)

    def pv_binder(self) -> None:
        """PersistentVolume controller (subset; pkg/controller/volume/persistentvolume/
        pv_controller.go syncUnboundClaim and bind): a claim naming a volume (spec.volumeName)
        binds to it when the volume is Available or pre-bound to that claim and its storage
        class, access modes and capacity fit (checkVolumeSatisfyClaim); a claim naming none
        binds to a volume pre-bound to it, a claimRef with its namespace and name (and uid, if
        any), when that volume's access modes include the claim's and its capacity and
        volumeMode fit (findBestMatchForClaim: pv_index.go findByClaim, util.go
        FindMatchingVolume's IsVolumeBoundToClaim branch, which does not compare the storage
        class). Not played: matching a claim to any Available volume of its class, dynamic
        provisioning (claims of a class are left to that class's provisioner)."""
        pv_res, pvc_res = self.R("persistentvolumes"), self.R("persistentvolumeclaims")
        for pv in self.list(pv_res):
            st = pv.setdefault("status", {})
            ref = pv.get("spec", {}).get("claimRef")
            claim = ref and self.get(pvc_res, ref.get("namespace", ""), ref.get("name", ""))
            bound = bool(claim) and claim.get("spec", {}).get("volumeName") == \
                pv["metadata"]["name"] and claim.get("status", {}).get("phase") == "Bound"
            want = "Bound" if bound else ("Released" if ref and ref.get("uid") else "Available")
            if st.get("phase") != want:
                st["phase"] = want
                self.store.put(self.key(pv_res), pv)
        for pvc in self.list(pvc_res):
            spec, st = pvc.get("spec", {}), pvc.setdefault("status", {})
            if st.get("phase") == "Bound":
                continue
            pv: Obj | None
            if spec.get("volumeName"):
                pv = self.get(pv_res, "", spec["volumeName"])
                if pv is not None:
                    ref = pv.get("spec", {}).get("claimRef")
                    if not (not ref or _claim_ref_names(ref, pvc)) or \
                            not _volume_fits(pv, pvc, compare_class=True):
                        pv = None
            else:
                pv = next((v for v in self.list(pv_res)
                           if _claim_ref_names(v.get("spec", {}).get("claimRef"), pvc)
                           and _volume_fits(v, pvc, compare_class=False)), None)
            if pv is None:
                if st.get("phase") != "Pending":
                    st["phase"] = "Pending"
                    self.store.put(self.key(pvc_res), pvc)
                continue
            self._bind(pv, pvc)

    def _bind(self, pv: Obj, pvc: Obj) -> None:
        """pv_controller.go bind: the volume's claimRef (reference.GetReference of the claim)
        and, unless the volume was pre-bound to the claim, its annotation
        pv.kubernetes.io/bound-by-controller; the claim's volumeName, its annotations
        pv.kubernetes.io/bind-completed and (when the controller chose the volume)
        bound-by-controller; both phases Bound, the claim's status with the volume's access
        modes and capacity."""
        pv_res, pvc_res = self.R("persistentvolumes"), self.R("persistentvolumeclaims")
        md, name = pvc["metadata"], pv["metadata"]["name"]
        if not _claim_ref_names(pv["spec"].get("claimRef"), pvc):
            pv["metadata"].setdefault("annotations", {}).setdefault(
                "pv.kubernetes.io/bound-by-controller", "yes")
        pv["spec"]["claimRef"] = {"kind": "PersistentVolumeClaim", "namespace": md["namespace"],
                                  "name": md["name"], "uid": md["uid"], "apiVersion": "v1",
                                  "resourceVersion": md.get("resourceVersion", "")}
        pv["status"] = {"phase": "Bound"}
        self.store.put(self.key(pv_res), pv)
        annotations = md.setdefault("annotations", {})
        if pvc["spec"].get("volumeName") != name:
            pvc["spec"]["volumeName"] = name
            annotations.setdefault("pv.kubernetes.io/bound-by-controller", "yes")
        annotations.setdefault("pv.kubernetes.io/bind-completed", "yes")
        pvc["status"] = {"phase": "Bound", "accessModes": pv["spec"].get("accessModes"),
                         "capacity": pv["spec"].get("capacity")}
        self.store.put(self.key(pvc_res), pvc)

    def scheduler(self) -> None:
        pods_res = self.R("pods")
        nodes = self.list(self.R("nodes"))
        pods = self.list(pods_res)
        for pod in pods:
            spec = pod.get("spec", {})
            if spec.get("nodeName") or spec.get("schedulerName") != "default-scheduler" or \
                    not is_active(pod):
                continue
            node, msg = dra_server.schedule(self, pod, nodes, pods)
            st = pod.setdefault("status", {})
            if node:
                spec["nodeName"] = node
                st["conditions"] = [{"type": "PodScheduled", "status": "True",
                                     "lastTransitionTime": ts()}]
                self.store.put(self.key(pods_res), pod)
                pods = [p if p["metadata"]["uid"] != pod["metadata"]["uid"] else pod
                        for p in pods]
                self.event(pod, "Normal", "Scheduled", f"Successfully assigned "
                           f"{pod['metadata']['namespace']}/{pod['metadata']['name']} to {node}")
            else:
                cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                        "message": msg, "lastTransitionTime": ts()}
                old = next((c for c in st.get("conditions") or []
                            if c.get("type") == "PodScheduled"), None)
                if old is None or old.get("message") != msg:
                    st["conditions"] = [cond]
                    self.store.put(self.key(pods_res), pod)
                    self.event(pod, "Warning", "FailedScheduling", msg)

    def pod_gc(self) -> None:
        pods_res = self.R("pods")
        names = {n["metadata"]["name"] for n in self.list(self.R("nodes"))}
        for pod in self.list(pods_res):
            nn = pod.get("spec", {}).get("nodeName")
            if nn and nn not in names:
                self.store.delete(self.key(pods_res), pod["metadata"]["namespace"],
                                  pod["metadata"]["name"])

    # ---------------------------------------------------------------- eviction / proxies
    def evict(self, ns: str, name: str, dry: bool = False) -> Obj:
        pods_res = self.R("pods")
        pod = self.get(pods_res, ns, name)
        if pod is None:
            raise not_found(pods_res, name)
        labels = pod["metadata"].get("labels") or {}
        for pdb in self.list(self.R("pdb"), ns):
            spec = pdb.get("spec", {})
            if not match_labels(spec.get("selector"), labels):
                continue
            _, healthy, need = self.pdb_budget(pdb)
            allowed = healthy - need
            if allowed <= 0 and pod_ready(pod):
                raise HTTPError(429, "TooManyRequests",
                                "Cannot evict pod as it would violate the pod's disruption "
                                "budget.", {"causes": [{
                                    "reason": "DisruptionBudget",
                                    "message": f"The disruption budget {pdb['metadata']['name']}"
                                               f" needs {need} healthy pods and has {healthy} "
                                               "currently"}]})
        if not dry:
            self.store.delete(self.key(pods_res), ns, name)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "code": 201}

    def pdb_budget(self, pdb: Obj) -> tuple[int, int, int]:
        """(expected pods, healthy pods, pods that must stay healthy) of a PodDisruptionBudget."""
        spec = pdb.get("spec", {})
        matched = [p for p in self.list(self.R("pods"), pdb["metadata"].get("namespace"))
                   if match_labels(spec.get("selector"), p["metadata"].get("labels") or {})
                   and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")]
        healthy = sum(pod_ready(p) for p in matched)
        if "minAvailable" in spec:
            need = self._int_or_percent(spec["minAvailable"], len(matched), up=True)
        else:
            need = len(matched) - self._int_or_percent(spec.get("maxUnavailable", 1),
                                                       len(matched), up=True)
        return len(matched), healthy, max(need, 0)

    def disruption(self) -> None:
        """The disruption controller: each PodDisruptionBudget's status (what `kubectl get
        pdb` shows as ALLOWED DISRUPTIONS), written only when it changes."""
        res = self.R("pdb")
        for pdb in self.list(res):
            expected, healthy, need = self.pdb_budget(pdb)
            allowed = max(healthy - need, 0)
            old = pdb.get("status") or {}
            cond = {"type": "DisruptionAllowed", "status": "True" if allowed else "False",
                    "reason": "SufficientPods" if allowed else "InsufficientPods",
                    "message": "", "observedGeneration": pdb["metadata"].get("generation", 1)}
            prev = next((c for c in old.get("conditions") or []
                         if c.get("type") == "DisruptionAllowed"), {})
            cond["lastTransitionTime"] = prev.get("lastTransitionTime", ts()) if prev.get(
                "status") == cond["status"] else ts()
            new = {"observedGeneration": pdb["metadata"].get("generation", 1),
                   "disruptionsAllowed": allowed, "currentHealthy": healthy,
                   "desiredHealthy": need, "expectedPods": expected, "conditions": [cond]}
            if new != old:
                pdb["status"] = new
                self.update(res, pdb, status_only=True)

    @staticmethod
    def _int_or_percent(v: Any, total: int, up: bool) -> int:
        s = str(v)
        if s.endswith("%"):
            pct = int(s[:-1]) * total
            return -(-pct // 100) if up else pct // 100
        return int(s)

    def kubelet_get(self, node_name: str, path: str) -> bytes:
        node = self.get(self.R("nodes"), "", node_name)
        if node is None:
            raise not_found(self.R("nodes"), node_name)
        addr = next((a["address"] for a in node.get("status", {}).get("addresses") or []
                     if a.get("type") == "InternalIP"), None)
        port = node.get("status", {}).get("daemonEndpoints", {}).get(
            "kubeletEndpoint", {}).get("Port", 10250)
        if not addr:
            raise HTTPError(503, "ServiceUnavailable", "no preferred addresses found; known "
                            "addresses: []")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        try:
            conn = http.client.HTTPSConnection(addr, port, context=ctx, timeout=10)
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
        except OSError as e:
            raise HTTPError(500, "InternalError", f"error trying to reach service: dial tcp "
                            f"{addr}:{port}: connect: {e.strerror or e}") from e
        if resp.status >= 400:
            raise HTTPError(resp.status, "BadRequest", body.decode(errors="replace").strip())
        return body

    def pod_log(self, ns: str, name: str, query: dict[str, list[str]]) -> bytes:
        pods_res = self.R("pods")
        pod = self.get(pods_res, ns, name)
        if pod is None:
            raise not_found(pods_res, name)
        containers = [c["name"] for c in pod["spec"].get("containers") or []]
        cname = (query.get("container") or [None])[0]
        if cname is None:
            if len(containers) > 1:
                raise HTTPError(400, "BadRequest", f"a container name must be specified for pod "
                                f"{name}, choose one of: [{' '.join(containers)}]")
            cname = containers[0] if containers else ""
        cst = next((c for c in pod.get("status", {}).get("containerStatuses") or []
                    if c.get("name") == cname), None)
        waiting = (cst or {}).get("state", {}).get("waiting")
        if not pod["spec"].get("nodeName") or cst is None or (waiting and not cst.get(
                "lastState")):
            reason = (waiting or {}).get("reason", "ContainerCreating")
            raise HTTPError(400, "BadRequest", f'container "{cname}" in pod "{name}" is waiting '
                            f"to start: {reason}")
        passed = [(k, v[0]) for k, v in query.items()
                  if k in ("tailLines", "previous", "limitBytes", "timestamps") and v]
        query = ("?" + urllib.parse.urlencode(passed)) if passed else ""
        return self.kubelet_get(pod["spec"]["nodeName"],
                                f"/containerLogs/{ns}/{name}/{cname}{query}")

    def pod_exec(self, ns: str, name: str, q: dict[str, list[str]]
                 ) -> tuple[bytes, bytes, Obj]:
        """A non-interactive exec (no stdin, no tty) through the pod's kubelet: (stdout,
        stderr, the Status the real server sends on the error channel)."""
        pods_res = self.R("pods")
        pod = self.get(pods_res, ns, name)
        if pod is None:
            raise not_found(pods_res, name)
        if self._flag(q, "stdin") or self._flag(q, "tty"):
            raise HTTPError(400, "BadRequest", "the lab's API server stand-in runs exec without "
                            "stdin or a tty only (kubectl exec POD -- CMD, without -i/-t)")
        containers = [c["name"] for c in pod["spec"].get("containers") or []]
        cname = self._one(q, "container") or (containers[0] if containers else "")
        if cname not in containers:
            raise HTTPError(400, "BadRequest", f"container {cname} is not valid for pod {name}")
        if pod.get("status", {}).get("phase") != "Running" or not pod["spec"].get("nodeName"):
            raise HTTPError(400, "BadRequest", "unable to upgrade connection: container not "
                            "found (\"" + cname + "\")")
        argv = q.get("command") or []
        query = urllib.parse.urlencode([("command", a) for a in argv])
        path = "/exec/" + "/".join(urllib.parse.quote(x, safe="") for x in (ns, name, cname))
        res = json.loads(self.kubelet_get(pod["spec"]["nodeName"], f"{path}?{query}"))
        if "error" in res:
            return b"", b"", {"metadata": {}, "status": "Failure", "message": res["error"]}
        out, err = base64.b64decode(res["stdout"]), base64.b64decode(res["stderr"])
        code = int(res["exitCode"])
        if code == 0:
            return out, err, {"metadata": {}, "status": "Success"}
        return out, err, {"metadata": {}, "status": "Failure",
                          "message": f"command terminated with non-zero exit code: error "
                                     f"executing command [{' '.join(argv)}], exit code {code}",
                          "reason": "NonZeroExitCode",
                          "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}

    # ---------------------------------------------------------------- discovery / misc
    def version_info(self) -> Obj:
        gv = git_version(self.version)
        major, minor = gv[1:].split(".")[:2]
        return {"major": major, "minor": minor, "emulationMajor": major, "emulationMinor": minor,
                "minCompatibilityMajor": major, "minCompatibilityMinor": str(int(minor) - 1),
                "gitVersion": gv, "gitCommit": hashlib.sha1(gv.encode()).hexdigest(),
                "gitTreeState": "clean", "buildDate": "2026-05-14T10:24:31Z",
                "goVersion": "go1.25.9", "compiler": "gc", "platform": "linux/amd64"}

    def metrics(self) -> str:
        lines = featuregates.metrics_lines(self.gates)
        lines += ["# HELP apiserver_storage_objects [STABLE] Number of stored objects",
                  "# TYPE apiserver_storage_objects gauge"]
        for g, p in sorted(self.store.resource_keys()):
            n = len(self.store.list((g, p)))
            lines.append(f'apiserver_storage_objects{{resource="{p + "." + g if g else p}"}} {n}')
        return "\n".join(lines) + "\n"

    # ---------------------------------------------------------------- serving
    def serve(self) -> None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(P(self.flags.get("tls-cert-file", "/etc/kubernetes/pki/apiserver.crt")),
                            P(self.flags.get("tls-private-key-file",
                                             "/etc/kubernetes/pki/apiserver.key")))
        ctx.load_verify_locations(P(self.ca_file))
        ctx.verify_mode = ssl.CERT_OPTIONAL
        api = self

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 128

            def get_request(self):  # type: ignore[no-untyped-def]
                sock, addr = self.socket.accept()
                # no Nagle, as Go's net package sets for every TCP connection: headers and
                # body are two writes, and with Nagle on, each response waited for the
                # client's delayed ACK (about 40 ms a request)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return ctx.wrap_socket(sock, server_side=True,
                                       do_handshake_on_connect=False), addr

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                self.request.settimeout(30)
                try:
                    self.request.do_handshake()
                except (ssl.SSLError, OSError) as e:
                    sys.stderr.write(f"http: TLS handshake error from {self.client_address}: "
                                     f"{e}\n")
                    raise
                super().setup()

            def log_message(self, fmt: str, *args: Any) -> None:
                if os.environ.get("GPUK8S_LAB_APISERVER_LOG"):
                    sys.stderr.write(fmt % args + "\n")

            def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
                data = body if isinstance(body, bytes) else (
                    body.encode() if isinstance(body, str) else json.dumps(body).encode())
                self.send_response(code)
                for text in _REQUEST.__dict__.pop("warnings", []):
                    # k8s.io/apiserver pkg/endpoints/handlers/responsewriters: 299 warn-agent
                    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
                    self.send_header("Warning", f'299 - "{escaped}"')
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, events: Any, ctype: str) -> None:
                """A watch: one JSON object per chunk until the stream ends or the client
                goes away."""
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.request.settimeout(None)
                try:
                    for ev in events:
                        data = json.dumps(ev).encode() + b"\n"
                        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except (OSError, ValueError):
                    self.close_connection = True

            def _websocket(self, run: Any) -> None:
                """A Kubernetes remote-command websocket (v5/v4.channel.k8s.io): stdout on
                channel 1, stderr on 2, the result Status on 3, then a close."""
                if self.headers.get("Upgrade", "").lower() != "websocket":
                    raise HTTPError(400, "BadRequest", "Upgrade request required")
                offered = [p.strip() for p in
                           self.headers.get("Sec-WebSocket-Protocol", "").split(",")]
                proto = next((p for p in ("v5.channel.k8s.io", "v4.channel.k8s.io")
                              if p in offered), None)
                if proto is None:
                    raise HTTPError(400, "BadRequest", "websocket: the client offered none of "
                                    "v5.channel.k8s.io, v4.channel.k8s.io")
                key = self.headers.get("Sec-WebSocket-Key", "")
                accept = base64.b64encode(hashlib.sha1(
                    (key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
                self.send_response(101, "Switching Protocols")
                self.send_header("Upgrade", "websocket")
                self.send_header("Connection", "Upgrade")
                self.send_header("Sec-WebSocket-Accept", accept)
                self.send_header("Sec-WebSocket-Protocol", proto)
                self.end_headers()

                def frame(payload: bytes, opcode: int = 2) -> bytes:
                    n = len(payload)
                    head = bytes([0x80 | opcode])
                    if n < 126:
                        head += bytes([n])
                    elif n < 65536:
                        head += bytes([126]) + n.to_bytes(2, "big")
                    else:
                        head += bytes([127]) + n.to_bytes(8, "big")
                    return head + payload

                try:
                    out, err, status = run()
                except HTTPError as e:  # after the upgrade: the client reads it on channel 3
                    out, err, status = b"", b"", e.status()
                chunk = 32768
                for channel, data in ((1, out), (2, err)):
                    for i in range(0, len(data), chunk):
                        self.wfile.write(frame(bytes([channel]) + data[i:i + chunk]))
                self.wfile.write(frame(bytes([3]) + json.dumps(status).encode()))
                self.wfile.write(frame((1000).to_bytes(2, "big"), opcode=8))
                self.wfile.flush()
                self.close_connection = True
                with contextlib.suppress(OSError):  # let the client send its close first
                    self.request.settimeout(2)
                    self.request.recv(128)

            def _handle(self, method: str) -> None:
                _REQUEST.__dict__.pop("warnings", None)
                try:
                    n = int(self.headers.get("Content-Length") or 0)
                    body = self.rfile.read(n) if n else b""
                    code, out, ctype = api.handle(self, method, body)
                    if code == -1:
                        self._stream(out, ctype)
                    elif code == -2:
                        self._websocket(out)
                    else:
                        self._send(code, out, ctype)
                except HTTPError as e:
                    self._send(e.code, e.status())
                except Conflict as e:  # another API server changed it since this one read it
                    self._send(409, HTTPError(409, "Conflict", "Operation cannot be fulfilled: "
                                              f"{e}: the object has been modified; please apply "
                                              "your changes to the latest version and try again"
                                              ).status())
                except StoreError as e:  # etcd is down or lost quorum
                    self._send(500, HTTPError(500, "InternalError", str(e)).status())
                except merge.PatchError as e:
                    self._send(e.code, HTTPError(e.code, e.reason, e.message,
                                                 {"causes": e.causes} if e.causes else {}
                                                 ).status())
                except Exception as e:  # pragma: no cover - diagnostics
                    traceback.print_exc()
                    self._send(500, HTTPError(500, "InternalError", str(e)).status())

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_PUT(self) -> None:
                self._handle("PUT")

            def do_PATCH(self) -> None:
                self._handle("PATCH")

            def do_DELETE(self) -> None:
                self._handle("DELETE")

        srv = Server((self.bind, self.port), Handler)
        threading.Thread(target=self.controllers, daemon=True).start()
        threading.Thread(target=self.endpoint_reconciler, daemon=True,
                         name="endpoint-reconciler").start()
        sys.stderr.write(f"Serving securely on {self.bind}:{self.port}\n")
        srv.serve_forever()

    def handle(self, h: BaseHTTPRequestHandler, method: str, body: bytes
               ) -> tuple[int, Any, str]:
        u = urllib.parse.urlsplit(h.path)
        q = urllib.parse.parse_qs(u.query)
        parts = [urllib.parse.unquote(p) for p in u.path.strip("/").split("/") if p]
        text = "text/plain; charset=utf-8"
        js = "application/json"
        if parts and parts[0] in ("livez", "readyz", "healthz"):
            if not self.store.healthy():  # etcd down, or without quorum
                return 500, (f"[+]ping ok\n[-]etcd failed: reason withheld\n{parts[0]} check "
                             "failed\n"), text
            if "verbose" in q or "verbose" in u.query.split("&"):  # ?verbose has no value
                return 200, f"[+]ping ok\n[+]etcd ok\n{parts[0]} check passed\n", text
            return 200, "ok", text
        if parts == ["version"]:
            return 200, self.version_info(), js
        info = self.user_info(h)
        user, groups = info.username, list(info.groups)
        anonymous = "system:unauthenticated" in groups
        if parts == ["metrics"]:
            if anonymous:
                raise HTTPError(403, "Forbidden", 'forbidden: User "system:anonymous" cannot get '
                                'path "/metrics"')
            return 200, self.metrics(), text
        if parts == ["openapi", "v2"] and method == "GET":
            # an empty OpenAPI v2 document (protobuf: zero bytes): no paths, no schemas, so
            # kubectl validates nothing client-side for kinds the v3 documents do not list
            return 200, b"", "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
        if parts[:2] == ["openapi", "v3"] and method == "GET":
            if anonymous:
                raise HTTPError(403, "Forbidden", f'forbidden: User "{user}" cannot get path '
                                f'"{u.path}"')
            if len(parts) == 2:
                return 200, discovery.openapi_index(self.registry), js
            gv = parts[2:]
            g, v = ("", gv[1]) if gv[0] == "api" and len(gv) == 2 else (
                (gv[1], gv[2]) if gv[0] == "apis" and len(gv) == 3 else ("?", "?"))
            known = self.registry.resources + discovery.VIRTUAL
            if not any((r.group, r.version) == (g, v) for r in known):
                raise HTTPError(404, "NotFound", "the server could not find the requested "
                                "resource")
            return 200, discovery.openapi_doc(self.registry, g, v), js
        if not parts or parts[0] not in ("api", "apis"):
            raise HTTPError(404, "NotFound", "the server could not find the requested resource")
        if method == "GET" and len(parts) <= 3 and not (parts[0] == "api" and len(parts) == 3):
            if anonymous:
                raise HTTPError(403, "Forbidden", f'forbidden: User "{user}" cannot get '
                                f'path "{u.path}"')
            accept = h.headers.get("Accept", "")
            if len(parts) == 1 and discovery.wants_aggregated(accept):
                return 200, discovery.aggregated(self.registry, parts == ["api"]), \
                    discovery.AGGREGATED
            disc = discovery.legacy(self.registry, parts, f"{self.advertise}:{self.port}")
            if disc is None:
                raise HTTPError(404, "NotFound", "the server could not find the requested "
                                "resource")
            return 200, disc, js
        if parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        else:
            group, version, rest = parts[1], parts[2], parts[3:]
        ns = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        plural, name, sub = rest[0], (rest[1] if len(rest) > 1 else ""), "/".join(rest[2:])
        virtual = next((r for r in discovery.VIRTUAL
                        if (r.group, r.version, r.plural) == (group, version, plural)), None)
        if virtual is not None and method == "POST":
            if h.headers.get("Content-Type", "").startswith("application/vnd.kubernetes.protobuf"):
                try:
                    _, kind, fields = wire.unwrap(body)
                except wire.WireError as e:
                    raise HTTPError(400, "BadRequest", f"the object provided is unrecognized: "
                                    f"{e}") from e
                obj = wire.review(kind or virtual.kind, fields)
            else:
                obj = self._decode(body, h)
            return 201, self.review(virtual, obj, user, groups, info), js
        res = self.registry.by_path(group, version, plural)
        watching = method == "GET" and self._flag(q, "watch")
        if res is None:
            # authorization comes before routing: a resource the server does not serve is
            # 403 to whom RBAC refuses it (Felix's KubeVirt list in a cluster without
            # KubeVirt), 404 only to whom it allows
            unknown = Resource(group, version, "", plural, bool(ns))
            verb = "watch" if watching else {"GET": "get" if name else "list", "POST": "create",
                                             "PUT": "update", "PATCH": "patch",
                                             "DELETE": "delete"}.get(method, "get")
            if not self.authorize(user, groups, verb, unknown, ns, name, sub):
                raise self.forbidden(user, verb, unknown, ns, name, sub)
            raise HTTPError(404, "NotFound", "the server could not find the requested resource")
        verb = {"GET": "get" if name else "list", "POST": "create", "PUT": "update",
                "PATCH": "patch", "DELETE": "delete"}[method]
        if watching:
            verb = "watch"
        if method == "DELETE" and not name:
            verb = "deletecollection"
        if sub == "eviction":
            verb = "create"
        rbac_sub = "proxy" if sub.startswith("proxy/") else sub  # RBAC's services/proxy
        if not self.authorize(user, groups, verb, res, ns, name, rbac_sub):
            raise self.forbidden(user, verb, res, ns, name, rbac_sub)
        return self.dispatch(method, res, ns, name, sub, q, body, h, user, info)

    @staticmethod
    def forbidden(user: str, verb: str, res: Resource, ns: str, name: str, sub: str
                  ) -> HTTPError:
        scope = f'in the namespace "{ns}"' if ns else "at the cluster scope"
        rname = f"{res.plural}/{sub}" if sub else res.plural
        msg = (f'{res.qualified}{" " + chr(34) + name + chr(34) if name else ""} is '
               f'forbidden: User "{user}" cannot {verb} resource "{rname}" in API group '
               f'"{res.group}" {scope}')
        return HTTPError(403, "Forbidden", msg, {"name": name, "group": res.group,
                                                 "kind": res.plural})

    def review(self, res: Resource, obj: Obj, user: str, groups: list[str],
               info: admission.UserInfo | None = None) -> Obj:
        """SelfSubjectAccessReview, SubjectAccessReview, SelfSubjectRulesReview and
        SelfSubjectReview: answered at once, never stored."""
        out = {**obj, "apiVersion": res.api_version, "kind": res.kind}
        out.setdefault("metadata", {})["creationTimestamp"] = None
        spec = obj.get("spec") or {}
        if res.kind == "SelfSubjectReview":
            out["status"] = {"userInfo": info.as_request() if info is not None else
                             {"username": user, "groups": groups}}
            return out
        if res.kind == "SelfSubjectRulesReview":
            allowed = self.authorize(user, groups, "create", self.R("clusterroles"), "", "", "")
            out["status"] = {"resourceRules": [{"verbs": ["*"], "apiGroups": ["*"],
                                                "resources": ["*"]}] if allowed else [],
                             "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]
                             if allowed else [], "incomplete": False}
            return out
        if res.kind == "SubjectAccessReview":
            user, groups = spec.get("user", ""), list(spec.get("groups") or [])
        attrs = spec.get("resourceAttributes")
        if attrs is not None:
            target = self.registry.lookup(f"{attrs.get('resource', '')}."
                                          f"{attrs.get('group', '')}".rstrip(".")) or Resource(
                attrs.get("group", ""), attrs.get("version", "v1"), "", attrs.get("resource", ""),
                bool(attrs.get("namespace")))
            ok = self.authorize(user, groups, attrs.get("verb", ""), target,
                                attrs.get("namespace", ""), attrs.get("name", ""),
                                attrs.get("subresource", ""))
        else:
            ok = "system:masters" in groups or self.authorize(user, groups, "get", None, "", "",
                                                              "")
        out["status"] = {"allowed": ok}
        if ok and "system:masters" in groups:
            out["status"]["reason"] = ""
        return out

    # ---------------------------------------------------------------- REST of one resource
    @staticmethod
    def _one(q: dict[str, list[str]], key: str, default: str = "") -> str:
        return (q.get(key) or [default])[0]

    @classmethod
    def _flag(cls, q: dict[str, list[str]], key: str) -> bool:
        """A boolean query parameter as the real server parses it (Go's strconv.ParseBool:
        1, t, T, TRUE, true, True; the Python clients send watch=True)."""
        return cls._one(q, key) in ("1", "t", "T", "TRUE", "true", "True")

    def _manager(self, q: dict[str, list[str]], h: BaseHTTPRequestHandler) -> str:
        mgr = self._one(q, "fieldManager")
        if mgr:
            if len(mgr) > 128:
                raise HTTPError(422, "Invalid", "fieldManager: Too long: may not be more than "
                                "128 bytes")
            return mgr
        agent = h.headers.get("User-Agent", "unknown")
        return agent.split("/", 1)[0] or "unknown"

    def _validate(self, res: Resource, obj: Obj, q: dict[str, list[str]]) -> list[str]:
        """fieldValidation: Strict refuses unknown fields (400), Warn (the default) returns them
        as warnings, Ignore drops them silently."""
        mode = self._one(q, "fieldValidation", "Warn")
        if mode not in ("Strict", "Warn", "Ignore"):
            raise HTTPError(400, "BadRequest", f"fieldValidation parameter unsupported: {mode}")
        sch = schema.for_kind(res.group, res.version, res.kind)
        unknown = schema.unknown_fields(obj, sch)
        if unknown and mode == "Strict":
            listed = ", ".join(f'unknown field "{p}"' for p in unknown)
            raise HTTPError(400, "BadRequest", f"{res.kind} in version \"{res.version}\" cannot "
                            f"be handled as a {res.kind}: strict decoding error: {listed}")
        schema.prune(obj, sch)
        return [] if mode == "Ignore" else [f'unknown field "{p}"' for p in unknown]

    def _table_or_list(self, res: Resource, items: list[Obj], q: dict[str, list[str]],
                       h: BaseHTTPRequestHandler) -> Obj:
        if tables.wants_table(h.headers.get("Accept", "")):
            return tables.table(res.plural, items, str(self.store.rv),
                                self._one(q, "includeObject", "Metadata"))
        return {"kind": res.kind + "List", "apiVersion": res.api_version,
                "metadata": {"resourceVersion": str(self.store.rv)}, "items": items}

    def _selected(self, q: dict[str, list[str]]) -> Any:
        ls, fs = self._one(q, "labelSelector"), self._one(q, "fieldSelector")
        return lambda o: selector_match(ls, o["metadata"].get("labels") or {}) and \
            field_match(fs, o)

    def watch(self, res: Resource, ns: str, name: str, q: dict[str, list[str]],
              h: BaseHTTPRequestHandler) -> Any:
        """The watch stream: ADDED/MODIFIED/DELETED events after resourceVersion (all current
        objects first when it is "" or "0", or with sendInitialEvents), BOOKMARKs when asked
        for, 410 Gone for a version older than the server keeps, ERROR when it expires."""
        rv_arg = self._one(q, "resourceVersion")
        initial = self._flag(q, "sendInitialEvents") or rv_arg in ("", "0")
        bookmarks = self._flag(q, "allowWatchBookmarks")
        try:
            since = int(rv_arg or 0)
        except ValueError as e:
            raise HTTPError(400, "BadRequest", f'invalid resource version: "{rv_arg}"') from e
        if rv_arg not in ("", "0") and since < self.store.oldest_rv():
            raise HTTPError(410, "Expired", f"too old resource version: {since} "
                            f"({self.store.oldest_rv() + 1})")
        timeout = float(self._one(q, "timeoutSeconds") or 1800)
        as_table = tables.wants_table(h.headers.get("Accept", ""))
        include = self._one(q, "includeObject", "Metadata")
        selected = self._selected(q)
        key = self.key(res)

        def mine(o: Obj | None) -> bool:
            if o is None:
                return False
            md = o["metadata"]
            return (not ns or md.get("namespace") == ns) and (
                not name or md["name"] == name) and selected(o)

        headers = [True]

        def wrap(etype: str, obj: Obj) -> Obj:
            if as_table and etype != "BOOKMARK":
                t = tables.table(res.plural, [obj], obj["metadata"]["resourceVersion"], include,
                                 headers=headers[0])
                headers[0] = False
                return {"type": etype, "object": t}
            return {"type": etype, "object": obj}

        def bookmark(rv: int, end: bool = False) -> Obj:
            md: Obj = {"resourceVersion": str(rv)}
            if end:
                md["annotations"] = {"k8s.io/initial-events-end": "true"}
            return {"type": "BOOKMARK", "object": {"kind": res.kind, "apiVersion":
                                                   res.api_version, "metadata": md}}

        def events() -> Any:
            cur = since
            with self.store.lock:
                if initial:
                    cur = self.store.rv
                    snapshot = [o for o in self.list(res, ns or None) if mine(o)]
                else:
                    snapshot = []
            for o in snapshot:
                yield wrap("ADDED", o)
            if initial and self._flag(q, "sendInitialEvents"):
                yield bookmark(cur, end=True)
            deadline = time.monotonic() + timeout
            last_bookmark = time.monotonic()
            while time.monotonic() < deadline:
                batch, seen = self.store.events_after(
                    cur, key, max(0.0, min(5.0, deadline - time.monotonic())))
                for e in batch:
                    was, now_ = mine(e.old), mine(e.obj)
                    if e.type == "DELETED":
                        if was:
                            yield wrap("DELETED", e.obj)
                    elif now_:
                        yield wrap("ADDED" if e.type == "ADDED" or not was else "MODIFIED",
                                   e.obj)
                    elif was:
                        yield wrap("DELETED", e.obj)
                cur = max(cur, seen)
                if bookmarks and time.monotonic() - last_bookmark > 10:
                    last_bookmark = time.monotonic()
                    yield bookmark(cur)

        return events()

    def dispatch(self, method: str, res: Resource, ns: str, name: str, sub: str,
                 q: dict[str, list[str]], body: bytes, h: BaseHTTPRequestHandler,
                 user: str = "", info: admission.UserInfo | None = None
                 ) -> tuple[int, Any, str]:
        js = "application/json"
        dry = self._one(q, "dryRun") == "All"
        # proxies to the kubelet run outside the lock: a slow kubelet must not stall the server
        if sub == "log" and res.plural == "pods":
            return 200, self.pod_log(ns, name, q), "text/plain"
        if sub.startswith("proxy") and res.plural == "nodes":
            path = "/" + sub[len("proxy"):].lstrip("/")
            return 200, self.kubelet_get(name, path), js
        if sub.split("/")[0] == "proxy" and res.plural == "services":
            return svcproxy.serve(self, ns, name, h.path, method, body, dict(h.headers.items()),
                                  HTTPError)
        if sub == "exec" and res.plural == "pods":
            return -2, lambda: self.pod_exec(ns, name, q), ""
        if method == "GET" and self._flag(q, "watch"):
            return -1, self.watch(res, ns, name, q, h), js
        if sub == "status" and (res.group, res.plural) in self.crd_resources and \
                (res.group, res.plural) not in self.crd_status:
            # a custom resource without the status subresource has no /status endpoint
            raise HTTPError(404, "NotFound", "the server could not find the requested resource")
        if sub == "token" and res.plural == "serviceaccounts" and method == "POST":
            with self.lock:
                return 201, self.token_request(ns, name, body, h), js
        if sub not in ("", "status", "eviction"):
            raise HTTPError(404, "NotFound", "the server could not find the requested resource")
        if res.plural == "pods" and not sub and (method == "POST" or (
                method == "PATCH" and h.headers.get("Content-Type", "").startswith(
                    "application/apply-patch") and self.read(res, ns, name) is None)):
            self._await_default_service_account(ns, body, h)
        with self.lock:
            if sub == "eviction" and method == "POST":
                return 201, self.evict(ns, name, dry), js
            if method == "GET" and name:
                obj = self.read(res, ns, name)
                if obj is None:
                    raise not_found(res, name)
                if tables.wants_table(h.headers.get("Accept", "")):
                    return 200, tables.table(res.plural, [obj], obj["metadata"].get(
                        "resourceVersion", ""), self._one(q, "includeObject", "Metadata")), js
                return 200, obj, js
            if method == "GET":
                items = self.list(res, ns or None, self._selected(q))
                return 200, self._table_or_list(res, items, q, h), js
            mgr = self._manager(q, h)
            sch = schema.for_kind(res.group, res.version, res.kind)
            if method == "POST":
                obj = self._decode(body, h)
                if obj.get("kind") and obj.get("kind") != res.kind:
                    raise HTTPError(400, "BadRequest", f"the object provided is unrecognized "
                                    f"(must be of type {res.kind})")
                self._validate(res, obj, q)
                merge.track_update(None, obj, mgr, sch, res.api_version)
                return 201, self.create(res, obj, ns, dry=dry, user=info), js
            if method == "PUT":
                obj = self._decode(body, h)
                obj.setdefault("metadata", {})["name"] = name
                if res.namespaced:
                    obj["metadata"]["namespace"] = ns
                self._validate(res, obj, q)
                old = self.read(res, ns, name)
                if old is None:
                    raise not_found(res, name)
                self._check_rv(res, old, obj)
                merge.track_update(old, obj, mgr, sch, res.api_version, sub)
                return 200, self.update(res, obj, status_only=(sub == "status"), dry=dry,
                                        user=info), js
            if method == "PATCH":
                # a patch without a resourceVersion is applied again to the newest object when
                # another API server wrote it first (the real GuaranteedUpdate); this server's
                # cache catches up through its etcd watch
                for attempt in range(10):
                    try:
                        return 200, self.patch(res, ns, name, sub, q, body, h, mgr, dry,
                                               info), js
                    except Conflict:
                        if attempt == 9 or b'"resourceVersion"' in body:
                            raise
                        time.sleep(0.2)
            if method == "DELETE":
                if not name:
                    gone = self.list(res, ns or None, self._selected(q))
                    refused: HTTPError | None = None
                    for o in gone:  # each item is deleted, and admitted, on its own
                        try:
                            self.delete(res, o["metadata"].get("namespace", ""),
                                        o["metadata"]["name"], dry=dry, user=info)
                        except HTTPError as e:
                            refused = refused or e
                    if refused is not None:
                        raise refused
                    return 200, self._table_or_list(res, gone, q, h), js
                return 200, self.delete(res, ns, name, dry=dry, user=info), js
        raise HTTPError(405, "MethodNotAllowed", "the server does not allow this method")

    @staticmethod
    def _decode(body: bytes, h: BaseHTTPRequestHandler) -> Obj:
        ctype = h.headers.get("Content-Type", "application/json").split(";")[0].strip()
        if ctype == "application/vnd.kubernetes.protobuf":
            try:
                _, kind, fields = wire.unwrap(body)
                obj = wire.simple_object(kind, fields)
            except wire.WireError:
                obj = None
            if obj is not None:
                return obj
        if ctype not in ("application/json", "application/yaml", ""):
            raise HTTPError(415, "UnsupportedMediaType", f"the body of the request was in an "
                            f"unknown format - accepted media types include: application/json, "
                            f"application/yaml (the lab's API server stand-in reads no "
                            f"{ctype})")
        if ctype == "application/yaml":
            docs = yaml_load_all(body.decode())
            return docs[0] if docs and isinstance(docs[0], dict) else {}
        try:
            obj = json.loads(body or b"{}")
        except ValueError as e:
            raise HTTPError(400, "BadRequest", f"the object provided is unrecognized: {e}") from e
        if not isinstance(obj, dict):
            raise HTTPError(400, "BadRequest", "the object provided is unrecognized")
        return obj

    def _check_rv(self, res: Resource, old: Obj, new: Obj) -> None:
        rv = new.get("metadata", {}).get("resourceVersion")
        if rv and rv != old["metadata"].get("resourceVersion"):
            raise HTTPError(409, "Conflict", f'Operation cannot be fulfilled on {res.qualified} '
                            f'"{old["metadata"]["name"]}": the object has been modified; please '
                            "apply your changes to the latest version and try again",
                            {"name": old["metadata"]["name"], "group": res.group,
                             "kind": res.plural})

    def patch(self, res: Resource, ns: str, name: str, sub: str, q: dict[str, list[str]],
              body: bytes, h: BaseHTTPRequestHandler, mgr: str, dry: bool,
              user: admission.UserInfo | None = None) -> Obj:
        ctype = h.headers.get("Content-Type", "").split(";")[0].strip()
        sch = schema.for_kind(res.group, res.version, res.kind)
        old = self.read(res, ns, name)
        if ctype == "application/apply-patch+yaml":
            try:
                docs = yaml_load_all(body.decode())
            except Exception as e:
                raise HTTPError(400, "BadRequest", f"error decoding YAML: {e}") from e
            applied = docs[0] if docs else {}
            if not isinstance(applied, dict) or (applied.get("kind"), applied.get(
                    "apiVersion")) != (res.kind, res.api_version):
                raise HTTPError(400, "BadRequest", "the object provided is unrecognized")
            if "fieldManager" not in q:
                raise HTTPError(400, "BadRequest", "PatchOptions.meta.k8s.io \"\" is invalid: "
                                "fieldManager: Required value: is required for apply patch")
            unknown = schema.unknown_fields(applied, sch)
            if unknown:
                where = f"{ns}/{name}" if res.namespaced else f"/{name}"
                raise HTTPError(500, "", f"failed to create typed patch object ({where}; "
                                f"{res.group}/{res.version}, Kind={res.kind}): "
                                f".{unknown[0]}: field not declared in schema")
            md = applied.setdefault("metadata", {})
            md["name"] = name
            if res.namespaced:
                md["namespace"] = ns
            force = self._flag(q, "force")
            new = merge.server_side_apply(old, applied, mgr, force, sch, res.api_version, sub)
            if old is None:
                return self.create(res, new, ns, dry=dry, user=user)
            return self.update(res, new, status_only=(sub == "status"), dry=dry, user=user)
        if old is None:
            raise not_found(res, name)
        try:
            patch = json.loads(body or b"{}")
        except ValueError as e:
            raise HTTPError(400, "BadRequest", f"error decoding patch: {e}") from e
        if ctype == "application/json-patch+json":
            if not isinstance(patch, list):
                raise HTTPError(400, "BadRequest", "json: cannot unmarshal object into Go value "
                                "of type jsonpatch.Patch")
            new = merge.json_patch(old, patch)
        elif ctype == "application/merge-patch+json":
            new = merge.json_merge(old, patch)
        elif ctype == "application/strategic-merge-patch+json":
            if res.group not in ("", "apps", "batch", "policy", "networking.k8s.io",
                                 "rbac.authorization.k8s.io", "storage.k8s.io",
                                 "scheduling.k8s.io", "node.k8s.io", "coordination.k8s.io",
                                 "certificates.k8s.io", "apiextensions.k8s.io",
                                 "admissionregistration.k8s.io", "resource.k8s.io"):
                raise HTTPError(415, "UnsupportedMediaType", "the body of the request was in an "
                                "unknown format - accepted media types include: "
                                "application/json-patch+json, application/merge-patch+json, "
                                "application/apply-patch+yaml")
            new = merge.strategic(old, patch, sch)
        else:
            raise HTTPError(415, "UnsupportedMediaType", "the body of the request was in an "
                            "unknown format - accepted media types include: "
                            "application/json-patch+json, application/merge-patch+json, "
                            "application/apply-patch+yaml, "
                            "application/strategic-merge-patch+json")
        if not isinstance(new, dict):
            raise HTTPError(422, "Invalid", f'{res.qualified} "{name}" is invalid: the patch '
                            "does not produce an object")
        self._validate(res, new, q)
        for k in ("name", "namespace", "uid"):
            if new.get("metadata", {}).get(k) != old["metadata"].get(k):
                raise HTTPError(422, "Invalid", f'{res.kind} "{name}" is invalid: metadata.{k}: '
                                "Invalid value: field is immutable")
        self._check_rv(res, old, new)
        merge.track_update(old, new, mgr, sch, res.api_version, sub)
        return self.update(res, new, status_only=(sub == "status"), dry=dry,
                           status_metadata=res.plural == "nodes", user=user)


def jws_detached(payload: str, token: str) -> str:
    """Detached JWS (HS256) over the cluster-info kubeconfig, keyed by the bootstrap token,
    as k8s.io/cluster-bootstrap/token/jws ComputeDetachedSignature."""
    tid, _, secret = token.partition(".")

    def b64u(b: bytes) -> str:
        return base64.urlsafe_b64encode(b).rstrip(b"=").decode()

    header = b64u(json.dumps({"alg": "HS256", "kid": tid}, separators=(",", ":")).encode())
    signing_input = f"{header}.{b64u(payload.encode())}".encode()
    sig = b64u(hmac.new(secret.encode(), signing_input, hashlib.sha256).digest())
    return f"{header}..{sig}"


def main(argv: list[str] | None = None) -> None:
    ApiServer(sys.argv[1:] if argv is None else argv).serve()


if __name__ == "__main__":
    main()
