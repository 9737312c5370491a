# LAB STAND-IN: not the real kube-apiserver. Test infrastructure for gpuk8s; never shipped to users.
"""ResourceQuota, LimitRange and the default user-facing ClusterRoles for the stand-in API
server: what a lab tenant (gpuk8s.tenancy) meets on a real cluster.

- LimitRanger (plugin/pkg/admission/limitranger/admission.go, defaultContainerResourceRequirements
  and mergeContainerResources): a container's missing requests and limits are filled from each
  LimitRange of type Container in the pod's namespace (default -> limits, defaultRequest ->
  requests; a missing request then defaults to the limit, as the API's own defaulting does).
- ResourceQuota admission (staging/src/k8s.io/apiserver/pkg/admission/plugin/resourcequota/
  controller.go, CheckRequest): a new pod whose usage would take any quota of its namespace past
  ``hard`` is refused with 403 ``pods "<name>" is forbidden: exceeded quota: <quota>, requested:
  <r>=<n>, used: <r>=<n>, limited: <r>=<n>`` (prettyPrint: the exceeded resources, sorted, joined
  by ","). A pod's usage is pkg/quota/v1/evaluator/core/pods.go's: ``pods`` 1, requests.* and
  limits.* the sum over its containers (an init container's when larger), for a pod not yet
  Succeeded or Failed. LAB SIMPLIFICATION: usage is computed from the pods at admission time
  instead of the quota's status (the real controller keeps status.used and admission adds to
  it); the resource quota controller here writes status.hard and status.used each pass.
- The bootstrap ClusterRoles ``view`` and ``edit`` with the rules the real API server reconciles
  them to (plugin/pkg/auth/authorizer/rbac/bootstrappolicy/testdata/cluster-roles.yaml, stored
  commit 025f2834: edit aggregates system:aggregate-to-edit and view's system:aggregate-to-view),
  and system:basic-user bound to system:authenticated.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from decimal import Decimal
from typing import Any

Obj = dict[str, Any]

_SUFFIX = {"": 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
           "P": 10**15, "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
           "Pi": 2**50, "Ei": 2**60}


def quantity(text: Any) -> Decimal:
    m = re.fullmatch(r"([0-9.]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?", str(text).strip())
    if not m:
        raise ValueError(f"quantities must match the regular expression "
                         f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text!r}")
    return Decimal(m[1]) * Decimal(_SUFFIX[m[2] or ""])


def shown(value: Decimal, like: str = "") -> str:
    """A quantity as the API prints it: whole numbers plain, fractions in milli-units, binary
    sizes in the largest whole binary unit when the limit was written that way."""
    if value == value.to_integral_value():
        n = int(value)
        if like.endswith("i"):
            for unit in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
                if n and n % _SUFFIX[unit] == 0:
                    return f"{n // int(_SUFFIX[unit])}{unit}"
        return str(n)
    return f"{int(value * 1000)}m"


def apply_limit_ranges(pod: Obj, ranges: Iterable[Obj]) -> None:
    """The API's defaulting (a request the container leaves out is its limit), then
    LimitRanger's defaults onto ``pod``'s containers (and init containers)."""
    for c in [*(pod["spec"].get("initContainers") or []), *(pod["spec"].get("containers") or [])]:
        res = c.get("resources") or {}
        for field in ("limits", "requests"):  # a quantity is always written back as a string
            if isinstance(res.get(field), dict):
                res[field] = {k: str(v) for k, v in res[field].items()}
        for k, v in (res.get("limits") or {}).items():
            res.setdefault("requests", {}).setdefault(k, v)
    for lr in ranges:
        for item in (lr.get("spec") or {}).get("limits") or []:
            if item.get("type") != "Container":
                continue
            for c in [*(pod["spec"].get("initContainers") or []),
                      *(pod["spec"].get("containers") or [])]:
                res = c.setdefault("resources", {})
                for field, default in (("limits", item.get("default") or {}),
                                       ("requests", item.get("defaultRequest") or {})):
                    for k, v in default.items():
                        if k not in (res.get(field) or {}):
                            res.setdefault(field, {})[k] = str(v)


def pod_usage(pod: Obj) -> dict[str, Decimal]:
    """What ``pod`` counts against a quota (pods.go PodUsageFunc)."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return {}

    def total(containers: list[Obj], field: str) -> dict[str, Decimal]:
        out: dict[str, Decimal] = {}
        for c in containers:
            for k, v in ((c.get("resources") or {}).get(field) or {}).items():
                out[k] = out.get(k, Decimal(0)) + quantity(v)
        return out

    usage: dict[str, Decimal] = {"pods": Decimal(1)}
    spec = pod.get("spec") or {}
    for field in ("requests", "limits"):
        main = total(spec.get("containers") or [], field)
        for c in spec.get("initContainers") or []:
            for k, v in ((c.get("resources") or {}).get(field) or {}).items():
                main[k] = max(main.get(k, Decimal(0)), quantity(v))
        for k, v in main.items():
            usage[f"{field}.{k}"] = v
            if field == "requests" and k in ("cpu", "memory"):
                usage[k] = v  # "cpu" and "memory" in a quota mean requests
    return usage


def used(pods: Iterable[Obj]) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {}
    for p in pods:
        for k, v in pod_usage(p).items():
            out[k] = out.get(k, Decimal(0)) + v
    return out


def _pretty(values: dict[str, str]) -> str:
    return ",".join(f"{k}={values[k]}" for k in sorted(values))


def check(pod: Obj, quotas: Iterable[Obj], others: list[Obj]) -> str | None:
    """The refusal of ``pod`` by the first quota it would exceed, or None."""
    want = pod_usage(pod)
    have = used(others)
    for rq in sorted(quotas, key=lambda q: q["metadata"]["name"]):
        hard = (rq.get("spec") or {}).get("hard") or {}
        exceeded = sorted(k for k in hard if k in want and
                          have.get(k, Decimal(0)) + want[k] > quantity(hard[k]))
        if exceeded:
            name = rq["metadata"]["name"]
            requested = _pretty({k: shown(want[k], hard[k]) for k in exceeded})
            in_use = _pretty({k: shown(have.get(k, Decimal(0)), hard[k]) for k in exceeded})
            limited = _pretty({k: str(hard[k]) for k in exceeded})
            return (f'pods "{pod["metadata"]["name"]}" is forbidden: exceeded quota: {name}, '
                    f"requested: {requested}, used: {in_use}, limited: {limited}")
    return None


def status(rq: Obj, pods: list[Obj]) -> Obj:
    hard = (rq.get("spec") or {}).get("hard") or {}
    have = used(pods)
    return {"hard": dict(hard),
            "used": {k: shown(have.get(k, Decimal(0)), str(hard[k])) for k in hard}}


def controller(list_: Callable[[str, str | None], list[Obj]],
               write_status: Callable[[Obj, Obj], None]) -> None:
    """The resource quota controller's pass: every quota's status from its namespace's pods."""
    for rq in list_("resourcequotas", None):
        st = status(rq, list_("pods", rq["metadata"]["namespace"]))
        if rq.get("status") != st:
            write_status(rq, st)


_VIEW = [
    ("", ["configmaps", "endpoints", "persistentvolumeclaims", "persistentvolumeclaims/status",
          "pods", "replicationcontrollers", "replicationcontrollers/scale", "serviceaccounts",
          "services", "services/status", "bindings", "events", "limitranges",
          "namespaces/status", "pods/log", "pods/status", "replicationcontrollers/status",
          "resourcequotas", "resourcequotas/status", "namespaces"], ["get", "list", "watch"]),
    ("discovery.k8s.io", ["endpointslices"], ["get", "list", "watch"]),
    ("apps", ["controllerrevisions", "daemonsets", "daemonsets/status", "deployments",
              "deployments/scale", "deployments/status", "replicasets", "replicasets/scale",
              "replicasets/status", "statefulsets", "statefulsets/scale", "statefulsets/status"],
     ["get", "list", "watch"]),
    ("autoscaling", ["horizontalpodautoscalers", "horizontalpodautoscalers/status"],
     ["get", "list", "watch"]),
    ("batch", ["cronjobs", "cronjobs/status", "jobs", "jobs/status"], ["get", "list", "watch"]),
    ("policy", ["poddisruptionbudgets", "poddisruptionbudgets/status"],
     ["get", "list", "watch"]),
    ("networking.k8s.io", ["ingresses", "ingresses/status", "networkpolicies"],
     ["get", "list", "watch"]),
]
_WRITE = ["create", "delete", "deletecollection", "patch", "update"]
_EDIT = [
    ("", ["pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "secrets",
          "services/proxy"], ["get", "list", "watch"]),
    ("", ["serviceaccounts"], ["impersonate"]),
    ("", ["pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy"], _WRITE),
    ("", ["pods/eviction"], ["create"]),
    ("", ["configmaps", "events", "persistentvolumeclaims", "replicationcontrollers",
          "replicationcontrollers/scale", "secrets", "serviceaccounts", "services",
          "services/proxy"], _WRITE),
    ("", ["serviceaccounts/token"], ["create"]),
    ("apps", ["daemonsets", "deployments", "deployments/rollback", "deployments/scale",
              "replicasets", "replicasets/scale", "statefulsets", "statefulsets/scale"], _WRITE),
    ("autoscaling", ["horizontalpodautoscalers"], _WRITE),
    ("batch", ["cronjobs", "jobs"], _WRITE),
    ("policy", ["poddisruptionbudgets"], _WRITE),
    ("networking.k8s.io", ["ingresses", "networkpolicies"], _WRITE),
    ("coordination.k8s.io", ["leases"], ["create", "delete", "deletecollection", "get", "list",
                                         "patch", "update", "watch"]),
]


def _role(name: str, rules: list[tuple[str, list[str], list[str]]]) -> Obj:
    return {"metadata": {"name": name,
                         "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
                         "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}},
            "rules": [{"apiGroups": [g], "resources": r, "verbs": v} for g, r, v in rules]}


#: what the real API server's RBAC post-start hook reconciles (the ClusterRoles gpuk8s binds)
BOOTSTRAP_ROLES = [
    _role("view", _VIEW),
    _role("edit", _EDIT + _VIEW),
    _role("system:basic-user", [
        ("authorization.k8s.io", ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
         ["create"]),
        ("authentication.k8s.io", ["selfsubjectreviews"], ["create"])]),
]
BOOTSTRAP_BINDINGS = [
    {"metadata": {"name": "system:basic-user",
                  "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                 "name": "system:basic-user"},
     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                   "name": "system:authenticated"}]},
]
