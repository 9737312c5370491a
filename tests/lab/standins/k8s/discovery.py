# LAB STAND-IN: not the real kube-apiserver. Test infrastructure for gpuk8s; never shipped to users.
"""Discovery documents: legacy (/api, /apis, /api/v1, /apis/G/V), aggregated
(apidiscovery.k8s.io/v2 APIGroupDiscoveryList, what kubectl 1.36 asks for first) and the OpenAPI v3
index and group-version documents kubectl reads to learn that the server validates fields itself
(the `fieldValidation` query parameter of each PATCH operation)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .resources import Registry, Resource

Obj = dict[str, Any]
VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
STATUS_KINDS = {"pods", "nodes", "services", "namespaces", "persistentvolumes",
                "persistentvolumeclaims", "deployments", "daemonsets", "replicasets",
                "statefulsets", "jobs", "cronjobs", "poddisruptionbudgets",
                "certificatesigningrequests", "customresourcedefinitions", "resourceclaims"}
# subresource -> (response group, version, kind or "" for the parent's kind, verbs)
EXTRA_SUBS: dict[str, list[tuple[str, str, str, str, list[str]]]] = {
    "pods": [("eviction", "policy", "v1", "Eviction", ["create"]),
             ("log", "", "v1", "Pod", ["get"]), ("binding", "", "v1", "Binding", ["create"]),
             ("exec", "", "v1", "PodExecOptions", ["create", "get"])],
    "nodes": [("proxy", "", "v1", "NodeProxyOptions", ["create", "delete", "get", "patch",
                                                        "update"])],
    "deployments": [("scale", "autoscaling", "v1", "Scale", ["get", "patch", "update"])],
    "replicasets": [("scale", "autoscaling", "v1", "Scale", ["get", "patch", "update"])],
    "statefulsets": [("scale", "autoscaling", "v1", "Scale", ["get", "patch", "update"])],
}
# resources that are not stored objects but requests answered at once (create only)
VIRTUAL = [
    Resource("authorization.k8s.io", "v1", "SelfSubjectAccessReview",
             "selfsubjectaccessreviews", False),
    Resource("authorization.k8s.io", "v1", "SelfSubjectRulesReview", "selfsubjectrulesreviews",
             False),
    Resource("authorization.k8s.io", "v1", "SubjectAccessReview", "subjectaccessreviews", False),
    Resource("authentication.k8s.io", "v1", "SelfSubjectReview", "selfsubjectreviews", False),
]


def _subs(r: Resource) -> list[tuple[str, str, str, str, list[str]]]:
    out = list(EXTRA_SUBS.get(r.plural, []))
    if r.plural in STATUS_KINDS:
        out.insert(0, ("status", r.group, r.version, r.kind, ["get", "patch", "update"]))
    return out


def _verbs(r: Resource) -> list[str]:
    return ["create"] if r in VIRTUAL else VERBS


def resource_list(rs: list[Resource], gv: str) -> Obj:
    out = []
    for r in rs:
        out.append({"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
                    "kind": r.kind, "verbs": _verbs(r),
                    **({"shortNames": list(r.short)} if r.short else {})})
        for sub, g, v, kind, verbs in _subs(r):
            out.append({"name": f"{r.plural}/{sub}", "singularName": "", "namespaced":
                        r.namespaced, "kind": kind, "verbs": verbs,
                        **({"group": g, "version": v} if (g, v) != (r.group, r.version)
                           else {})})
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out}


def _all(reg: Registry) -> list[Resource]:
    return [*reg.resources, *VIRTUAL]


def _groups(reg: Registry) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in _all(reg):
        vs = out.setdefault(r.group, [])
        if r.version not in vs:
            vs.append(r.version)
    return out


def legacy(reg: Registry, parts: list[str], address: str) -> Obj | None:
    if parts == ["api"]:
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": address}]}
    if parts == ["apis"]:
        groups = []
        for g, vs in _groups(reg).items():
            if g:
                gvs = [{"groupVersion": f"{g}/{v}", "version": v} for v in vs]
                groups.append({"name": g, "versions": gvs, "preferredVersion": gvs[0]})
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    if len(parts) == 2 and parts[0] == "apis":
        vs = _groups(reg).get(parts[1])
        if not vs:
            return None
        gvs = [{"groupVersion": f"{parts[1]}/{v}", "version": v} for v in vs]
        return {"kind": "APIGroup", "apiVersion": "v1", "name": parts[1], "versions": gvs,
                "preferredVersion": gvs[0]}
    gv = ("", parts[1]) if len(parts) == 2 and parts[0] == "api" else (
        (parts[1], parts[2]) if len(parts) == 3 and parts[0] == "apis" else None)
    if gv is None:
        return None
    rs = [r for r in _all(reg) if (r.group, r.version) == gv]
    if not rs:
        return None
    return resource_list(rs, f"{gv[0]}/{gv[1]}" if gv[0] else gv[1])


def aggregated(reg: Registry, legacy_core: bool) -> Obj:
    """APIGroupDiscoveryList for /api (legacy_core) or /apis."""
    items = []
    for g, vs in _groups(reg).items():
        if bool(g) == legacy_core:
            continue
        versions = []
        for v in vs:
            resources = []
            for r in [r for r in _all(reg) if (r.group, r.version) == (g, v)]:
                d: Obj = {"resource": r.plural,
                          "responseKind": {"group": r.group, "version": r.version,
                                           "kind": r.kind},
                          "scope": "Namespaced" if r.namespaced else "Cluster",
                          "singularResource": r.singular, "verbs": _verbs(r)}
                if r.short:
                    d["shortNames"] = list(r.short)
                subs = [{"subresource": sub, "responseKind": {"group": sg, "version": sv,
                                                              "kind": kind},
                         "verbs": verbs} for sub, sg, sv, kind, verbs in _subs(r)]
                if subs:
                    d["subresources"] = subs
                resources.append(d)
            versions.append({"version": v, "resources": resources, "freshness": "Current"})
        items.append({"metadata": {"name": g, "creationTimestamp": None}, "versions": versions})
    return {"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2",
            "metadata": {}, "items": items}


def wants_aggregated(accept: str) -> bool:
    first = accept.split(",")[0]
    return "as=APIGroupDiscoveryList" in first and "v=v2" in first


# ------------------------------------------------------------------ OpenAPI v3
def _gv_path(g: str, v: str) -> str:
    return f"apis/{g}/{v}" if g else f"api/{v}"


def openapi_doc(reg: Registry, g: str, v: str) -> Obj:
    """An OpenAPI 3 document of one group-version: the paths with their operations and the
    query parameters the server honours (no schemas: kubectl needs none to use server-side
    field validation)."""
    params = [{"name": n, "in": "query", "description": n, "schema": {"type": t},
               "uniqueItems": True} for n, t in (
        ("dryRun", "string"), ("fieldManager", "string"), ("fieldValidation", "string"),
        ("force", "boolean"))]
    paths: Obj = {}
    for r in [r for r in _all(reg) if (r.group, r.version) == (g, v)]:
        gvk = {"group": r.group, "version": r.version, "kind": r.kind}
        base = "/" + _gv_path(g, v) + (
            "/namespaces/{namespace}" if r.namespaced else "") + f"/{r.plural}"
        op = {"x-kubernetes-group-version-kind": gvk, "parameters": params,
              "responses": {"200": {"description": "OK"}}}
        paths[base] = {"post": {**op, "x-kubernetes-action": "post"}}
        if r not in VIRTUAL:
            paths[base + "/{name}"] = {
                "get": {**op, "x-kubernetes-action": "get", "parameters": []},
                "put": {**op, "x-kubernetes-action": "put"},
                "patch": {**op, "x-kubernetes-action": "patch"},
                "delete": {**op, "x-kubernetes-action": "delete"}}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "unversioned"},
            "paths": paths, "components": {"schemas": {}}}


def openapi_index(reg: Registry) -> Obj:
    out = {}
    for g, vs in _groups(reg).items():
        for v in vs:
            p = _gv_path(g, v)
            h = hashlib.sha512(json.dumps(openapi_doc(reg, g, v), sort_keys=True).encode()
                               ).hexdigest().upper()[:128]
            out[p] = {"serverRelativeURL": f"/openapi/v3/{p}?hash={h}"}
    return {"paths": out}
