"""The lab's RBAC (tests/lab/standins/k8s/rbac.py) and emulated programs (programs.py), without
booting the lab: what calico-node and kube-controllers v3.32.1 ask the API server for at start,
and how they fail when it refuses, against a fake API that answers as the stand-in's RBAC does."""

from __future__ import annotations

import time
from typing import Any

import yaml

from gpuk8s.roles import render
from tests.lab.standins.k8s import programs, rbac
from tests.lab.standins.k8s.client import ApiError
from tests.unit.scenarios import default_vars

Obj = dict[str, Any]
SA = "system:serviceaccount:kube-system:calico-node"


def calico_roles(drop: tuple[str, ...] = (), verb: str = "") -> dict[str, Obj]:
    """gpuk8s's rendered Calico ClusterRoles, the ``drop`` resources taken out of their rules
    (of the rules granting ``verb`` only, when given)."""
    docs = [d for d in yaml.safe_load_all(render("cni", "cni/calico.yaml.j2",
                                                 default_vars(cni="calico"))) if d]
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    for r in roles.values():
        r["rules"] = [{**rule, "resources": [x for x in rule["resources"] if x not in drop]}
                      if not verb or verb in rule["verbs"] else rule for rule in r["rules"]]
    return roles


class RbacApi:
    """A fake API server: RBAC as the stand-in's (rbac.allows), objects kept in memory."""

    def __init__(self, roles: dict[str, Obj], user: str, account: str = "") -> None:
        self.roles, self.user = roles, user
        self.objects: dict[str, Obj] = {}
        self.calls: list[tuple[str, str]] = []
        ns, sa = user.split(":")[2:4]
        binding = {"roleRef": {"kind": "ClusterRole", "name": account or sa},
                   "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]}
        self.bindings = [binding]

    def request(self, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        self.calls.append((method, path))
        parts = path.split("?")[0].strip("/").split("/")
        group = "" if parts[0] == "api" else parts[1]
        rest = parts[2:] if parts[0] == "api" else parts[3:]
        if len(rest) > 2 and rest[0] == "namespaces":
            rest = rest[2:]
        resource, name = rest[0], (rest[1] if len(rest) > 1 else "")
        sub = "/".join(rest[2:])
        verb = {"GET": "get" if name else "list", "POST": "create", "PUT": "update",
                "PATCH": "patch"}[method]
        groups = ["system:serviceaccounts", "system:authenticated"]
        ok = rbac.allows(self.user, groups, verb, group, f"{resource}/{sub}" if sub else
                         resource, "", name, lambda ns: self.bindings if ns is None else [],
                         lambda kind, ns, n: self.roles.get(n))
        if not ok:
            full = f"{resource}.{group}" if group else resource
            what = f"{resource}/{sub}" if sub else resource
            raise ApiError(403, {"reason": "Forbidden", "message": (
                f'{full}{" " + chr(34) + name + chr(34) if name else ""} is forbidden: User '
                f'"{self.user}" cannot {verb} resource "{what}" in API group "{group}" at the '
                "cluster scope")})
        key = f"{resource}/{name or (body or {}).get('metadata', {}).get('name', '')}"
        if method == "GET" and not name:
            return {"items": [o for k, o in self.objects.items() if k.startswith(resource)]}
        if method == "GET":
            if key not in self.objects and resource != "nodes":
                raise ApiError(404, {"reason": "NotFound", "message": "not found"})
            return self.objects.get(key, {"metadata": {"name": name}})
        if method == "PATCH":
            self.objects.setdefault(key, {}).setdefault("patches", []).append(body)
            return self.objects[key]
        self.objects[key] = body or {}
        return body


def calico_pod() -> tuple[Obj, Obj]:
    docs = [d for d in yaml.safe_load_all(render("cni", "cni/calico.yaml.j2",
                                                 default_vars(cni="calico"))) if d]
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    pod = {"metadata": {"name": "calico-node-x", "namespace": "kube-system", "uid": "u"},
           "spec": ds["spec"]["template"]["spec"]}
    return pod, pod["spec"]["containers"][0]


def test_calico_node_starts_and_felix_is_ready_with_gpuk8s_rbac() -> None:
    api = RbacApi(calico_roles(), SA)
    pod, container = calico_pod()
    out = programs.calico_node(programs.Api(api), pod, container, "gpu-01")  # type: ignore[arg-type]
    assert out.state == "ok", out.log
    assert ("POST", "/apis/crd.projectcalico.org/v1/bgpconfigurations") in api.calls
    assert api.objects["bgpconfigurations/default"]["spec"]["nodeToNodeMeshEnabled"] is True
    assert ("GET", "/apis/policy.networking.k8s.io/v1alpha2/clusternetworkpolicies") in api.calls


def test_calico_node_without_bgpconfiguration_create_terminates() -> None:
    api = RbacApi(calico_roles(drop=("bgpconfigurations",), verb="create"), SA)
    pod, container = calico_pod()
    out = programs.calico_node(programs.Api(api), pod, container, "gpu-01")  # type: ignore[arg-type]
    assert out.state == "crash" and out.exit_code == 1
    text = "\n".join(out.log)
    assert ("[ERROR][9] startup/startup.go 1387: Error creating default BGPConfiguration. "
            "error=connection is unauthorized: bgpconfigurations.crd.projectcalico.org is "
            'forbidden: User "system:serviceaccount:kube-system:calico-node" cannot create '
            'resource "bgpconfigurations" in API group "crd.projectcalico.org" at the cluster '
            "scope") in text
    assert "startup/utils.go 47: Terminating" in text


def test_felix_without_clusternetworkpolicies_is_never_ready() -> None:
    api = RbacApi(calico_roles(drop=("clusternetworkpolicies",)), SA)
    pod, container = calico_pod()
    out = programs.calico_node(programs.Api(api), pod, container, "gpu-01")  # type: ignore[arg-type]
    assert out.state == "unready"
    assert "ResourceType=ClusterNetworkPolicy" in out.log[-2]
    assert "readiness probe reporting 503" in out.log[-1]


def test_kube_controllers_without_status_rbac_starts_no_controller() -> None:
    sa = "system:serviceaccount:kube-system:calico-kube-controllers"
    pod, _ = calico_pod()
    ok = RbacApi(calico_roles(), sa)
    out = programs.calico_kube_controllers(programs.Api(ok), pod, {}, "cp-01")  # type: ignore[arg-type]
    assert "Started the controllers" in out.log[-1]
    assert ("PUT", "/apis/crd.projectcalico.org/v1/kubecontrollersconfigurations/default/status"
            ) in ok.calls
    refused = RbacApi(calico_roles(drop=("kubecontrollersconfigurations/status",)), sa)
    out = programs.calico_kube_controllers(programs.Api(refused), pod, {}, "cp-01")  # type: ignore[arg-type]
    assert "unable to perform status update" in out.log[-1] and "forbidden" in out.log[-1]


def test_rbac_rules_match_as_the_real_authorizer() -> None:
    rule = {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"],
            "resourceNames": ["calico-cni-plugin"]}
    assert rbac.rule_allows(rule, "", "serviceaccounts/token", "create", "calico-cni-plugin")
    assert not rbac.rule_allows(rule, "", "serviceaccounts/token", "create", "other")
    assert not rbac.rule_allows(rule, "", "serviceaccounts", "create", "calico-cni-plugin")
    star = {"apiGroups": ["*"], "resources": ["*"], "verbs": ["get"]}
    assert rbac.rule_allows(star, "apps", "daemonsets", "get", "x")
    assert not rbac.rule_allows(star, "apps", "daemonsets", "delete", "x")
    assert rbac.subject_matches({"kind": "ServiceAccount", "name": "a"},
                                "system:serviceaccount:ns:a", [], "ns")
    assert not rbac.subject_matches({"kind": "ServiceAccount", "name": "a", "namespace": "x"},
                                    "system:serviceaccount:ns:a", [], "ns")


def test_tokens_name_their_account_and_expire() -> None:
    key = rbac.signing_key(b"-----BEGIN PRIVATE KEY-----\nlab\n")
    sa = {"metadata": {"name": "calico-node", "uid": "sa-uid"}}
    pod = {"metadata": {"name": "calico-node-x", "uid": "pod-uid"}}
    token, exp = rbac.issue(key, "kube-system", sa, 3600, pod)
    claims = rbac.claims(key, token)
    assert claims is not None and exp > time.time()
    assert rbac.user_of(claims) == (SA, ["system:serviceaccounts",
                                         "system:serviceaccounts:kube-system",
                                         "system:authenticated"])
    assert claims["kubernetes.io"]["pod"] == {"name": "calico-node-x", "uid": "pod-uid"}
    assert rbac.claims(rbac.signing_key(b"another cluster"), token) is None
    head, body, sig = token.split(".")
    assert rbac.claims(key, f"{head}.{body}x.{sig}") is None


def flannel() -> tuple[dict[str, Obj], Obj, Obj]:
    docs = [d for d in yaml.safe_load_all(render("cni", "cni/flannel.yaml.j2", default_vars()))
            if d]
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    pod = {"metadata": {"name": "kube-flannel-ds-x", "namespace": "kube-flannel", "uid": "u"},
           "spec": ds["spec"]["template"]["spec"]}
    return roles, pod, pod["spec"]["containers"][0]


def test_flanneld_leases_with_gpuk8s_rbac_and_exits_without_pod_get() -> None:
    """flanneld v0.28.9 (kube.go, main.go): its pod, every node, its node, then its lease as
    annotations on nodes/<n>/status; without `get pods` it exits at once."""
    user = "system:serviceaccount:kube-flannel:flannel"
    roles, pod, container = flannel()
    api = RbacApi(roles, user)
    api.objects["nodes/gpu-01"] = {"metadata": {"name": "gpu-01", "annotations": {}},
                                   "spec": {"podCIDR": "10.244.1.0/24"},
                                   "status": {"addresses": [{"type": "InternalIP",
                                                             "address": "10.88.0.12"}]}}
    out = programs.flanneld(programs.Api(api), pod, container, "gpu-01")  # type: ignore[arg-type]
    assert out.state == "ok", out.log
    lease, condition = api.objects["nodes/gpu-01"]["patches"]
    assert lease["metadata"]["annotations"]["flannel.alpha.coreos.com/public-ip"] == \
        "10.88.0.12"
    assert condition["status"]["conditions"][0]["reason"] == "FlannelIsUp"
    for rule in roles["flannel"]["rules"]:
        rule["resources"] = [r for r in rule["resources"] if r != "pods"]
    out = programs.flanneld(programs.Api(RbacApi(roles, user)), pod, container,  # type: ignore[arg-type]
                            "gpu-01")
    assert out.state == "crash" and "error retrieving pod spec for " \
        "'kube-flannel/kube-flannel-ds-x': pods \"kube-flannel-ds-x\" is forbidden" in out.log[0]


def test_felix_without_the_kubevirt_rule_is_never_ready_even_without_kubevirt() -> None:
    """Felix lists KubeVirt's migrations whether or not KubeVirt is installed; authorization
    comes before routing, so a missing rule is a 403 (never in sync), not a harmless 404."""
    api = RbacApi(calico_roles(drop=("virtualmachineinstancemigrations",)), SA)
    pod, container = calico_pod()
    out = programs.calico_node(programs.Api(api), pod, container, "gpu-01")  # type: ignore[arg-type]
    assert out.state == "unready" and "ResourceType=KubeVirtLiveMigration" in out.log[-2]
