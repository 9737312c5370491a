# LAB STAND-IN: not the real kube-apiserver. Test infrastructure for gpuk8s; never shipped to users.
"""Server-side printing: the meta.k8s.io/v1 Table the real API server returns when a client asks
`Accept: application/json;as=Table;v=v1;g=meta.k8s.io` (what `kubectl get` sends).

Columns, their types, priorities (1 = only with `-o wide`) and cell texts follow the real server's
printers (pkg/printers/internalversion) for the kinds a lab admin lists; any other kind gets the
generic convertor's "Name" and "Created At" (type date, which kubectl shows as AGE).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .common import age, human_duration, now, parse_ts
from .dra import state as claim_state

Obj = dict[str, Any]
Col = tuple[str, str, int]  # (name, type, priority)

DESCRIPTIONS = {
    "Name": "Name must be unique within a namespace. Is required when creating resources, although "
            "some resources may allow a client to request the generation of an appropriate name "
            "automatically.",
    "Age": "CreationTimestamp is a timestamp representing the server time when this object was "
           "created.",
    "Created At": "CreationTimestamp is a timestamp representing the server time when this object "
                  "was created.",
    "State": "A summary of the current state (allocated, pending, reserved, etc.).",
}


def role_names(node: Obj) -> str:
    roles = sorted(k.split("/", 1)[1] for k in node["metadata"].get("labels") or {}
                   if k.startswith("node-role.kubernetes.io/"))
    return ",".join(roles) or "<none>"


def node_status(node: Obj) -> str:
    st = "Unknown"
    for c in node.get("status", {}).get("conditions") or []:
        if c.get("type") == "Ready":
            st = "Ready" if c.get("status") == "True" else "NotReady"
    if node.get("spec", {}).get("unschedulable"):
        st += ",SchedulingDisabled"
    return st


def pod_status(pod: Obj) -> str:
    st = pod.get("status", {})
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    reason = st.get("reason") or st.get("phase", "Pending")
    for cs in st.get("containerStatuses") or []:
        state = cs.get("state", {})
        if state.get("waiting", {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif state.get("terminated", {}).get("reason"):
            reason = state["terminated"]["reason"]
    if st.get("phase") == "Pending" and not st.get("containerStatuses") and \
            pod.get("spec", {}).get("nodeName"):
        reason = "ContainerCreating"
    return reason


def pod_restarts(pod: Obj) -> str:
    """'3' or, once a container has restarted, '3 (2m ago)' as the real printer shows it."""
    total, last = 0, None
    for cs in pod.get("status", {}).get("containerStatuses") or []:
        total += cs.get("restartCount", 0)
        fin = (cs.get("lastState") or {}).get("terminated", {}).get("finishedAt")
        if fin and (last is None or parse_ts(fin) > parse_ts(last)):
            last = fin
    return f"{total} ({age(last)} ago)" if total and last else str(total)


def address(node: Obj, kind: str) -> str:
    return next((a["address"] for a in node.get("status", {}).get("addresses") or []
                 if a.get("type") == kind), "<none>")


def _containers(spec: Obj) -> tuple[str, str]:
    cs = spec.get("template", {}).get("spec", {}).get("containers") or []
    return ",".join(c.get("name", "") for c in cs), ",".join(c.get("image", "") for c in cs)


def _selector(sel: Obj | None) -> str:
    if not sel:
        return "<none>"
    parts = [f"{k}={v}" for k, v in sorted((sel.get("matchLabels") or {}).items())]
    for e in sel.get("matchExpressions") or []:
        op, vals = e.get("operator"), ",".join(e.get("values") or [])
        parts.append({"In": f"{e['key']} in ({vals})", "NotIn": f"{e['key']} notin ({vals})",
                      "Exists": e["key"], "DoesNotExist": f"!{e['key']}"}.get(op, e["key"]))
    return ",".join(parts) or "<none>"


def _map(m: Obj | None) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted((m or {}).items())) or "<none>"


def _duration(st: Obj) -> str:
    if not st.get("startTime"):
        return ""
    end = parse_ts(st["completionTime"]) if st.get("completionTime") else now()
    return human_duration(max(int((end - parse_ts(st["startTime"])).total_seconds()), 0))


def _job_status(st: Obj) -> str:
    conds = {c["type"]: c["status"] for c in st.get("conditions") or []}
    for t in ("Complete", "Failed", "Suspended", "FailureTarget", "SuccessCriteriaMet"):
        if conds.get(t) == "True":
            return {"FailureTarget": "FailureTarget", "SuccessCriteriaMet": "SuccessCriteriaMet"
                    }.get(t, t)
    return "Running"


def _ports(spec: Obj) -> str:
    out = []
    for p in spec.get("ports") or []:
        s = str(p.get("port"))
        if p.get("nodePort") and spec.get("type") in ("NodePort", "LoadBalancer"):
            s += f":{p['nodePort']}"
        out.append(f"{s}/{p.get('protocol', 'TCP')}")
    return ",".join(out) or "<none>"


def _external_ip(spec: Obj, st: Obj) -> str:
    ips = list(spec.get("externalIPs") or [])
    if spec.get("type") == "LoadBalancer":
        ips += [i.get("ip") or i.get("hostname", "") for i in
                st.get("loadBalancer", {}).get("ingress") or []]
        return ",".join(ips) or "<pending>"
    if spec.get("type") == "ExternalName":
        return spec.get("externalName", "<none>")
    return ",".join(ips) or "<none>"


def _access_modes(modes: list[str] | None) -> str:
    short = {"ReadWriteOnce": "RWO", "ReadOnlyMany": "ROX", "ReadWriteMany": "RWX",
             "ReadWriteOncePod": "RWOP"}
    return ",".join(short.get(m, m) for m in modes or [])


def _claim(pv: Obj) -> str:
    ref = pv.get("spec", {}).get("claimRef")
    return f"{ref.get('namespace')}/{ref.get('name')}" if ref else ""


Printer = tuple[list[Col], Callable[[Obj], list[Any]]]

S, I_ = "string", "integer"
PRINTERS: dict[str, Printer] = {
    "nodes": ([("Name", S, 0), ("Status", S, 0), ("Roles", S, 0), ("Age", S, 0),
               ("Version", S, 0), ("Internal-IP", S, 1), ("External-IP", S, 1),
               ("OS-Image", S, 1), ("Kernel-Version", S, 1), ("Container-Runtime", S, 1)],
              lambda o: [o["metadata"]["name"], node_status(o), role_names(o),
                         age(o["metadata"].get("creationTimestamp")),
                         o.get("status", {}).get("nodeInfo", {}).get("kubeletVersion", ""),
                         address(o, "InternalIP"), address(o, "ExternalIP"),
                         o.get("status", {}).get("nodeInfo", {}).get("osImage", "<unknown>"),
                         o.get("status", {}).get("nodeInfo", {}).get("kernelVersion", "<unknown>"),
                         o.get("status", {}).get("nodeInfo", {}).get("containerRuntimeVersion",
                                                                     "<unknown>")]),
    "pods": ([("Name", S, 0), ("Ready", S, 0), ("Status", S, 0), ("Restarts", S, 0),
              ("Age", S, 0), ("IP", S, 1), ("Node", S, 1), ("Nominated Node", S, 1),
              ("Readiness Gates", S, 1)],
             lambda o: [o["metadata"]["name"],
                        f"{sum(1 for c in o.get('status', {}).get('containerStatuses') or [] if c.get('ready'))}"  # noqa: E501
                        f"/{len(o.get('spec', {}).get('containers') or [])}",
                        pod_status(o), pod_restarts(o), age(o["metadata"].get("creationTimestamp")),
                        o.get("status", {}).get("podIP") or "<none>",
                        o.get("spec", {}).get("nodeName") or "<none>",
                        o.get("status", {}).get("nominatedNodeName") or "<none>", "<none>"]),
    "deployments": ([("Name", S, 0), ("Ready", S, 0), ("Up-to-date", I_, 0),
                     ("Available", I_, 0), ("Age", S, 0), ("Containers", S, 1), ("Images", S, 1),
                     ("Selector", S, 1)],
                    lambda o: [o["metadata"]["name"],
                               f"{o.get('status', {}).get('readyReplicas', 0)}/"
                               f"{o.get('spec', {}).get('replicas', 1)}",
                               o.get("status", {}).get("updatedReplicas", 0),
                               o.get("status", {}).get("availableReplicas", 0),
                               age(o["metadata"].get("creationTimestamp")), *_containers(o["spec"]),
                               _selector(o["spec"].get("selector"))]),
    "replicasets": ([("Name", S, 0), ("Desired", I_, 0), ("Current", I_, 0), ("Ready", I_, 0),
                     ("Age", S, 0), ("Containers", S, 1), ("Images", S, 1), ("Selector", S, 1)],
                    lambda o: [o["metadata"]["name"], o.get("spec", {}).get("replicas", 1),
                               o.get("status", {}).get("replicas", 0),
                               o.get("status", {}).get("readyReplicas", 0),
                               age(o["metadata"].get("creationTimestamp")), *_containers(o["spec"]),
                               _selector(o["spec"].get("selector"))]),
    "daemonsets": ([("Name", S, 0), ("Desired", I_, 0), ("Current", I_, 0), ("Ready", I_, 0),
                    ("Up-to-date", I_, 0), ("Available", I_, 0), ("Node Selector", S, 0),
                    ("Age", S, 0), ("Containers", S, 1), ("Images", S, 1), ("Selector", S, 1)],
                   lambda o: [o["metadata"]["name"],
                              *(o.get("status", {}).get(k, 0) for k in (
                                  "desiredNumberScheduled", "currentNumberScheduled",
                                  "numberReady", "updatedNumberScheduled", "numberAvailable")),
                              _map(o["spec"].get("template", {}).get("spec", {})
                                   .get("nodeSelector")),
                              age(o["metadata"].get("creationTimestamp")), *_containers(o["spec"]),
                              _selector(o["spec"].get("selector"))]),
    "statefulsets": ([("Name", S, 0), ("Ready", S, 0), ("Age", S, 0), ("Containers", S, 1),
                      ("Images", S, 1)],
                     lambda o: [o["metadata"]["name"],
                                f"{o.get('status', {}).get('readyReplicas', 0)}/"
                                f"{o.get('spec', {}).get('replicas', 1)}",
                                age(o["metadata"].get("creationTimestamp")),
                                *_containers(o["spec"])]),
    "jobs": ([("Name", S, 0), ("Status", S, 0), ("Completions", S, 0), ("Duration", S, 0),
              ("Age", S, 0), ("Containers", S, 1), ("Images", S, 1), ("Selector", S, 1)],
             lambda o: [o["metadata"]["name"], _job_status(o.get("status", {})),
                        f"{o.get('status', {}).get('succeeded', 0)}/"
                        f"{o.get('spec', {}).get('completions', 1)}",
                        _duration(o.get("status", {})), age(o["metadata"].get("creationTimestamp")),
                        *_containers(o["spec"]), _selector(o["spec"].get("selector"))]),
    "services": ([("Name", S, 0), ("Type", S, 0), ("Cluster-IP", S, 0), ("External-IP", S, 0),
                  ("Port(s)", S, 0), ("Age", S, 0), ("Selector", S, 1)],
                 lambda o: [o["metadata"]["name"], o["spec"].get("type", "ClusterIP"),
                            o["spec"].get("clusterIP") or "<none>",
                            _external_ip(o["spec"], o.get("status", {})), _ports(o["spec"]),
                            age(o["metadata"].get("creationTimestamp")),
                            _map(o["spec"].get("selector"))]),
    "persistentvolumeclaims": (
        [("Name", S, 0), ("Status", S, 0), ("Volume", S, 0), ("Capacity", S, 0),
         ("Access Modes", S, 0), ("StorageClass", S, 0), ("VolumeAttributesClass", S, 0),
         ("Age", S, 0), ("VolumeMode", S, 1)],
        lambda o: [o["metadata"]["name"], o.get("status", {}).get("phase", "Pending"),
                   o["spec"].get("volumeName", ""),
                   (o.get("status", {}).get("capacity") or {}).get("storage", ""),
                   _access_modes(o.get("status", {}).get("accessModes")),
                   o["spec"].get("storageClassName") or "<unset>",
                   o["spec"].get("volumeAttributesClassName") or "<unset>",
                   age(o["metadata"].get("creationTimestamp")),
                   o["spec"].get("volumeMode", "Filesystem")]),
    "persistentvolumes": (
        [("Name", S, 0), ("Capacity", S, 0), ("Access Modes", S, 0), ("Reclaim Policy", S, 0),
         ("Status", S, 0), ("Claim", S, 0), ("StorageClass", S, 0),
         ("VolumeAttributesClass", S, 0), ("Reason", S, 0), ("Age", S, 0),
         ("VolumeMode", S, 1)],
        lambda o: [o["metadata"]["name"], (o["spec"].get("capacity") or {}).get("storage", ""),
                   _access_modes(o["spec"].get("accessModes")),
                   o["spec"].get("persistentVolumeReclaimPolicy", "Retain"),
                   o.get("status", {}).get("phase", "Pending"), _claim(o),
                   o["spec"].get("storageClassName", ""),
                   o["spec"].get("volumeAttributesClassName") or "<unset>",
                   o.get("status", {}).get("reason", ""),
                   age(o["metadata"].get("creationTimestamp")),
                   o["spec"].get("volumeMode", "Filesystem")]),
    "namespaces": ([("Name", S, 0), ("Status", S, 0), ("Age", S, 0)],
                   lambda o: [o["metadata"]["name"], o.get("status", {}).get("phase", "Active"),
                              age(o["metadata"].get("creationTimestamp"))]),
    "configmaps": ([("Name", S, 0), ("Data", I_, 0), ("Age", S, 0)],
                   lambda o: [o["metadata"]["name"],
                              len(o.get("data") or {}) + len(o.get("binaryData") or {}),
                              age(o["metadata"].get("creationTimestamp"))]),
    "secrets": ([("Name", S, 0), ("Type", S, 0), ("Data", I_, 0), ("Age", S, 0)],
                lambda o: [o["metadata"]["name"], o.get("type", "Opaque"), len(o.get("data") or {}),
                           age(o["metadata"].get("creationTimestamp"))]),
    "serviceaccounts": ([("Name", S, 0), ("Secrets", I_, 0), ("Age", S, 0)],
                        lambda o: [o["metadata"]["name"], len(o.get("secrets") or []),
                                   age(o["metadata"].get("creationTimestamp"))]),
    "runtimeclasses": ([("Name", S, 0), ("Handler", S, 0), ("Age", S, 0)],
                       lambda o: [o["metadata"]["name"], o.get("handler", ""),
                                  age(o["metadata"].get("creationTimestamp"))]),
    "poddisruptionbudgets": (
        [("Name", S, 0), ("Min Available", S, 0), ("Max Unavailable", S, 0),
         ("Allowed Disruptions", I_, 0), ("Age", S, 0)],
        lambda o: [o["metadata"]["name"], str(o["spec"].get("minAvailable", "N/A")),
                   str(o["spec"].get("maxUnavailable", "N/A")),
                   o.get("status", {}).get("disruptionsAllowed", 0),
                   age(o["metadata"].get("creationTimestamp"))]),
    "events": ([("Last Seen", S, 0), ("Type", S, 0), ("Reason", S, 0), ("Object", S, 0),
                ("Message", S, 0)],
               lambda o: [age(o.get("lastTimestamp") or o.get("eventTime")
                              or o["metadata"].get("creationTimestamp")),
                          o.get("type", ""), o.get("reason", ""),
                          f"{o.get('involvedObject', {}).get('kind', '').lower()}/"
                          f"{o.get('involvedObject', {}).get('name', '')}", o.get("message", "")]),
    "leases": ([("Name", S, 0), ("Holder", S, 0), ("Age", S, 0)],
               lambda o: [o["metadata"]["name"], o.get("spec", {}).get("holderIdentity", ""),
                          age(o["metadata"].get("creationTimestamp"))]),
    "priorityclasses": ([("Name", S, 0), ("Value", I_, 0), ("Global-Default", "boolean", 0),
                         ("Age", S, 0), ("PreemptionPolicy", S, 0)],
                        lambda o: [o["metadata"]["name"], o.get("value", 0),
                                   bool(o.get("globalDefault")),
                                   age(o["metadata"].get("creationTimestamp")),
                                   o.get("preemptionPolicy", "PreemptLowerPriority")]),
    "storageclasses": ([("Name", S, 0), ("Provisioner", S, 0), ("ReclaimPolicy", S, 0),
                        ("VolumeBindingMode", S, 0), ("AllowVolumeExpansion", S, 0),
                        ("Age", S, 0)],
                       lambda o: [o["metadata"]["name"], o.get("provisioner", ""),
                                  o.get("reclaimPolicy", "Delete"),
                                  o.get("volumeBindingMode", "Immediate"),
                                  str(bool(o.get("allowVolumeExpansion"))).lower(),
                                  age(o["metadata"].get("creationTimestamp"))]),
    # resource.k8s.io/v1 (Dynamic Resource Allocation, 1.34+)
    "deviceclasses": ([("Name", S, 0), ("Age", S, 0)],
                      lambda o: [o["metadata"]["name"],
                                 age(o["metadata"].get("creationTimestamp"))]),
    "resourceclaims": ([("Name", S, 0), ("State", S, 0), ("Age", S, 0)],
                       lambda o: [o["metadata"]["name"], claim_state(o),
                                  age(o["metadata"].get("creationTimestamp"))]),
    "resourceclaimtemplates": ([("Name", S, 0), ("Age", S, 0)],
                               lambda o: [o["metadata"]["name"],
                                          age(o["metadata"].get("creationTimestamp"))]),
    "resourceslices": ([("Name", S, 0), ("Node", S, 0), ("Driver", S, 0), ("Pool", S, 0),
                        ("Age", S, 0)],
                       lambda o: [o["metadata"]["name"], o["spec"].get("nodeName") or "",
                                  o["spec"].get("driver", ""),
                                  (o["spec"].get("pool") or {}).get("name", ""),
                                  age(o["metadata"].get("creationTimestamp"))]),
    "endpoints": ([("Name", S, 0), ("Endpoints", S, 0), ("Age", S, 0)],
                  lambda o: [o["metadata"]["name"],
                             ",".join(f"{a['ip']}:{p.get('port')}" for s in o.get("subsets") or []
                                      for a in s.get("addresses") or []
                                      for p in s.get("ports") or []) or "<none>",
                             age(o["metadata"].get("creationTimestamp"))]),
}


def generic(obj: Obj) -> list[Any]:
    return [obj["metadata"]["name"], obj["metadata"].get("creationTimestamp", "")]


GENERIC: list[Col] = [("Name", S, 0), ("Created At", "date", 0)]


def columns(plural: str) -> list[Obj]:
    cols = PRINTERS[plural][0] if plural in PRINTERS else GENERIC
    return [{"name": n, "type": t, "format": "name" if n == "Name" else "",
             "description": DESCRIPTIONS.get(n, n), "priority": p} for n, t, p in cols]


def row(plural: str, obj: Obj, include: str) -> Obj:
    cells = PRINTERS[plural][1](obj) if plural in PRINTERS else generic(obj)
    out: Obj = {"cells": cells}
    if include == "Object":
        out["object"] = obj
    elif include != "None":
        out["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                         "metadata": obj["metadata"]}
    return out


def table(plural: str, objs: list[Obj], rv: str, include: str = "Metadata",
          headers: bool = True, cont: str = "") -> Obj:
    out: Obj = {"kind": "Table", "apiVersion": "meta.k8s.io/v1",
                "metadata": {"resourceVersion": rv, **({"continue": cont} if cont else {})},
                "columnDefinitions": columns(plural) if headers else None,
                "rows": [row(plural, o, include) for o in objs]}
    return out


def wants_table(accept: str) -> bool:
    """The first acceptable media type is a meta.k8s.io Table (v1 or v1beta1)."""
    for part in accept.split(","):
        params = dict(p.strip().partition("=")[::2] for p in part.split(";")[1:])
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io":
            return True
        if part.strip().startswith("application/json") and "as" not in params:
            return False
    return False


def tabwriter(rows: list[list[str]], indent: str = "", pad: int = 3) -> str:
    """text/tabwriter with padding 3 as kubectl's printers use (describe and kubeadm use 2)."""
    if not rows:
        return ""
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.ljust(widths[i] + pad) if i < len(r) - 1 else c for i, c in enumerate(r)]
        out.append(indent + "".join(cells))
    return "\n".join(out) + "\n"
