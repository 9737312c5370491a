"""The lab API server's ValidatingAdmissionPolicy (tests/lab/standins/k8s/admission.py) and the
ServiceAccount user it checks (rbac.py: the node a pod-bound token names), without a booted lab:
the policy gpuk8s ships for NVIDIA's DRA kubelet plugin, evaluated by cel-python through the
API server's request path (authentication, RBAC, admission, the real refusal), and the
admission semantics of k8s.io/apiserver@kubernetes-1.34.0 the stand-in plays."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable
from typing import Any, cast

import pytest
import yaml

from gpuk8s.roles import render
from tests.lab.standins.k8s import admission, rbac
from tests.lab.standins.k8s.apiserver import ApiServer, HTTPError
from tests.lab.standins.k8s.resources import Registry
from tests.unit.scenarios import default_vars
from tests.unit.test_lab_dra import gpu_slice

Obj = dict[str, Any]
NS = "nvidia-dra-driver-gpu"
PLUGIN = f"system:serviceaccount:{NS}:nvidia-dra-driver-gpu-kubeletplugin"
POLICY = "gpuk8s-nvidia-dra-driver-gpu-resourceslices"
DENIED = (f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request: "
          "this user running on node 'gpu-01' may not modify resourceslices on node 'gpu-02'")
REGISTRY = Registry()
admission.register(REGISTRY)
SLICES = REGISTRY.lookup("resourceslices")
PODS = REGISTRY.lookup("pods")


def dra_docs() -> list[Obj]:
    return [d for d in yaml.safe_load_all(render("gpu_cluster", "gpu/nvidia-dra-driver.yaml.j2",
                                                 default_vars(gpu_allocation="dra"))) if d]


def policy_and_binding() -> tuple[list[Obj], list[Obj]]:
    docs = dra_docs()
    return ([d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"],
            [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"])


def plugin_user(node: str | None = "gpu-01") -> admission.UserInfo:
    extra = {rbac.POD_NAME: ["nvidia-dra-driver-gpu-kubelet-plugin-abcde"],
             rbac.POD_UID: ["pod-uid"]}
    if node:
        extra[rbac.NODE_NAME], extra[rbac.NODE_UID] = [node], [f"{node}-uid"]
    return admission.UserInfo(PLUGIN, ("system:serviceaccounts", f"system:serviceaccounts:{NS}",
                                       "system:authenticated"), "sa-uid", extra)


ADMIN = admission.UserInfo("kubernetes-admin", ("kubeadm:cluster-admins",
                                                "system:authenticated"))


def check(op: str, obj: Obj | None, old: Obj | None, user: admission.UserInfo,
          policies: list[Obj] | None = None, bindings: list[Obj] | None = None,
          res: Any = SLICES, namespace: Obj | None = None) -> str | list[str]:
    """'allowed' plus the warnings, or the refusal's message."""
    if policies is None:
        policies, bindings = policy_and_binding()
    md = (obj or old or {}).get("metadata") or {}
    a = admission.Attributes(op, res, md.get("name", ""), md.get("namespace", ""), obj, old,
                             user)
    try:
        return ["allowed", *admission.validate(policies, bindings or [], a, namespace)]
    except admission.Denied as e:
        return e.message


# ------------------------------------------------------------------ gpuk8s's policy
class TestTheKubeletPluginPolicy:
    def test_its_own_node_is_allowed(self) -> None:
        mine = gpu_slice("gpu-01", 2)
        assert check("CREATE", mine, None, plugin_user()) == ["allowed"]
        assert check("UPDATE", mine, mine, plugin_user()) == ["allowed"]
        assert check("DELETE", None, mine, plugin_user()) == ["allowed"]

    def test_another_nodes_slice_is_refused_with_the_real_message(self) -> None:
        other = gpu_slice("gpu-02", 1)
        name = other["metadata"]["name"]
        want = f'resourceslices.resource.k8s.io "{name}" is forbidden: {DENIED}'
        assert check("CREATE", other, None, plugin_user()) == want
        assert check("UPDATE", other, other, plugin_user()) == want
        # a delete has no object: the node is the old object's
        assert check("DELETE", None, other, plugin_user()) == want

    def test_slices_of_no_node_are_refused(self) -> None:
        everywhere = copy.deepcopy(gpu_slice("gpu-01", 1))
        del everywhere["spec"]["nodeName"]
        everywhere["spec"]["allNodes"] = True
        got = check("CREATE", everywhere, None, plugin_user())
        assert isinstance(got, str) and got.endswith(
            "this user running on node 'gpu-01' may not modify cluster resourceslices")

    def test_a_token_without_a_node_is_refused(self) -> None:
        got = check("CREATE", gpu_slice("gpu-01", 1), None, plugin_user(node=None))
        assert isinstance(got, str) and got.endswith(
            "denied request: no node association found for user, this user must run in a pod "
            "on a node and ServiceAccountTokenPodNodeInfo must be enabled")
        bare = admission.UserInfo(PLUGIN, ("system:serviceaccounts",))  # no extra at all
        got = check("CREATE", gpu_slice("gpu-01", 1), None, bare)
        assert isinstance(got, str) and "no node association found" in got

    def test_the_admin_and_the_control_plane_are_not_constrained(self) -> None:
        other = gpu_slice("gpu-02", 1)
        assert check("CREATE", other, None, ADMIN) == ["allowed"]
        gc = admission.UserInfo("system:kube-controller-manager", ("system:authenticated",))
        assert check("DELETE", None, other, gc) == ["allowed"]
        kubelet = admission.UserInfo("system:node:gpu-01", ("system:nodes",))
        assert check("DELETE", None, gpu_slice("gpu-01", 1), kubelet) == ["allowed"]

    def test_other_resources_are_not_matched(self) -> None:
        pod = {"metadata": {"name": "p", "namespace": "default"}, "spec": {}}
        assert check("CREATE", pod, None, plugin_user(), res=PODS) == ["allowed"]


# ------------------------------------------------------------------ through the API server
class MemStore:
    """The store the API server reads and writes, in memory (no etcd)."""

    def __init__(self) -> None:
        self.objs: dict[tuple[str, str, str, str], Obj] = {}
        self.rv = 1

    def get(self, key: tuple[str, str], ns: str, name: str) -> Obj | None:
        o = self.objs.get((*key, ns, name))
        return copy.deepcopy(o) if o else None

    def list(self, key: tuple[str, str], ns: str | None = None,
             where: Callable[[Obj], bool] | None = None) -> list[Obj]:
        return [copy.deepcopy(o) for (g, p, n, _), o in self.objs.items()
                if (g, p) == key and (ns is None or n == ns) and (where is None or where(o))]

    def shared(self, key: tuple[str, str], ns: str | None = None) -> list[Obj]:
        return [o for (g, p, n, _), o in self.objs.items()
                if (g, p) == key and (ns is None or n == ns)]

    def catch_up(self, timeout: float = 10) -> None:
        """In memory: always caught up."""

    def put(self, key: tuple[str, str], obj: Obj) -> Obj:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        md = obj["metadata"]
        self.objs[(*key, md.get("namespace", ""), md["name"])] = copy.deepcopy(obj)
        return obj

    def delete(self, key: tuple[str, str], ns: str, name: str) -> Obj | None:
        return self.objs.pop((*key, ns, name), None)

    def resource_keys(self) -> list[tuple[str, str]]:
        return sorted({(g, p) for g, p, _, _ in self.objs})


class Peer:
    def getpeercert(self) -> Obj:
        return {"subject": ((("organizationName", "system:masters"),),
                            (("commonName", "kubernetes-admin"),))}


class Request:
    """What the API server reads of a request handler."""

    def __init__(self, path: str, token: str = "", ctype: str = "application/json") -> None:
        self.path = path
        self.headers = {"Accept": "application/json", "Content-Type": ctype,
                        "User-Agent": "kubectl/v1.36.4"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.request = Peer()


KEY = rbac.signing_key(b"-----BEGIN PRIVATE KEY-----\nlab\n")


def api_server() -> ApiServer:
    """An API server with gpuk8s's DRA manifest applied (RBAC, the policy), gpu-01's plugin
    pod and the nodes; in memory."""
    api = ApiServer.__new__(ApiServer)
    api.registry = Registry()
    admission.register(api.registry)
    api.store = MemStore()  # type: ignore[assignment]
    api.lock = threading.RLock()
    api.crd_resources, api.crd_status = set(), set()
    api.sa_key_file, api._sa_key = "", KEY
    put = lambda plural, obj: api.store.put(  # noqa: E731
        api.key(api.R(plural)), {"metadata": {}, **obj})
    for doc in dra_docs():
        if doc["kind"] not in ("DaemonSet", "DeviceClass"):
            doc["metadata"]["uid"] = f"{doc['metadata']['name']}-uid"
            put(api.registry.by_kind(doc["apiVersion"], doc["kind"]).plural, doc)  # type: ignore[union-attr]
    for node in ("gpu-01", "gpu-02"):
        put("nodes", {"metadata": {"name": node, "uid": f"{node}-uid"}})
    put("pods", {"metadata": {"name": "plugin-abcde", "namespace": NS, "uid": "pod-uid"},
                 "spec": {"nodeName": "gpu-01",
                          "serviceAccountName": "nvidia-dra-driver-gpu-kubeletplugin"}})
    for s in (gpu_slice("gpu-01", 2), gpu_slice("gpu-02", 1)):
        put("resourceslices", s)
    return api


def plugin_token(api: ApiServer) -> str:
    """The token the kubelet asks for the plugin pod (TokenRequest bound to the pod)."""
    body = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                       "spec": {"expirationSeconds": 3607, "boundObjectRef": {
                           "apiVersion": "v1", "kind": "Pod", "name": "plugin-abcde",
                           "uid": "pod-uid"}}}).encode()
    got = api.token_request(NS, "nvidia-dra-driver-gpu-kubeletplugin", body,
                            cast(Any, Request("/")))
    return str(got["status"]["token"])


def send(api: ApiServer, method: str, path: str, body: Obj | None = None, token: str = ""
         ) -> tuple[int, Any]:
    h = cast(Any, Request(path, token))
    try:
        code, out, _ = api.handle(h, method, json.dumps(body).encode() if body else b"")
    except HTTPError as e:
        return e.code, e.status()
    return code, out


SLICE_PATH = "/apis/resource.k8s.io/v1/resourceslices"


class TestThroughTheApiServer:
    def test_a_pod_bound_token_names_its_pod_and_node(self) -> None:
        api = api_server()
        token = plugin_token(api)
        claims = rbac.claims(KEY, token)
        assert claims is not None
        assert claims["kubernetes.io"]["node"] == {"name": "gpu-01", "uid": "gpu-01-uid"}
        info = api.user_info(cast(Any, Request("/", token)))
        assert (info.username, info.uid) == (PLUGIN, "nvidia-dra-driver-gpu-kubeletplugin-uid")
        assert info.extra == {
            "authentication.kubernetes.io/pod-name": ["plugin-abcde"],
            "authentication.kubernetes.io/pod-uid": ["pod-uid"],
            "authentication.kubernetes.io/credential-id": [f"JTI={claims['jti']}"],
            "authentication.kubernetes.io/node-name": ["gpu-01"],
            "authentication.kubernetes.io/node-uid": ["gpu-01-uid"]}
        # kubectl auth whoami shows them
        code, review = send(api, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                            {"apiVersion": "authentication.k8s.io/v1",
                             "kind": "SelfSubjectReview"}, token)
        assert code == 201
        assert review["status"]["userInfo"]["extra"][rbac.NODE_NAME] == ["gpu-01"]

    def test_the_plugin_writes_its_own_slices_only(self) -> None:
        api = api_server()
        token = plugin_token(api)
        mine = gpu_slice("gpu-01", 1)
        mine["metadata"] = {"generateName": "00000-gpu.nvidia.com-gpu-01-"}
        code, created = send(api, "POST", SLICE_PATH, mine, token)
        assert code == 201 and created["spec"]["nodeName"] == "gpu-01"
        other = gpu_slice("gpu-02", 1)
        other["metadata"] = {"generateName": "00000-gpu.nvidia.com-gpu-02-"}
        code, status = send(api, "POST", SLICE_PATH, other, token)
        assert code == 422 and status["reason"] == "Invalid"
        name = status["details"]["name"]
        assert name.startswith("00000-gpu.nvidia.com-gpu-02-") and len(name) == 33
        assert status["message"] == \
            f'resourceslices.resource.k8s.io "{name}" is forbidden: {DENIED}'
        assert status["details"] == {"name": name, "group": "resource.k8s.io",
                                     "kind": "resourceslices", "causes": [{"message": DENIED}]}
        gpu02 = gpu_slice("gpu-02", 1)["metadata"]["name"]
        code, status = send(api, "DELETE", f"{SLICE_PATH}/{gpu02}", token=token)
        assert code == 422 and status["message"].endswith(DENIED)
        code, status = send(api, "DELETE", SLICE_PATH, token=token)  # deletecollection
        assert code == 403  # RBAC gives the plugin no deletecollection
        assert api.get(SLICES, "", gpu02) is not None
        # the admin is not constrained
        code, _ = send(api, "DELETE", f"{SLICE_PATH}/{gpu02}")
        assert code == 200 and api.get(SLICES, "", gpu02) is None

    def test_a_token_of_a_deleted_pod_is_refused(self) -> None:
        api = api_server()
        token = plugin_token(api)
        api.store.delete(("", "pods"), NS, "plugin-abcde")
        code, status = send(api, "GET", SLICE_PATH, token=token)
        assert (code, status["reason"]) == (401, "Unauthorized")


# ------------------------------------------------------------------ admission semantics
def vap(validations: list[Obj], rules: list[Obj] | None = None, **spec: Any) -> Obj:
    return {"metadata": {"name": "p"}, "spec": {
        "matchConstraints": {"resourceRules": rules or [
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
             "resources": ["pods"]}]}, "validations": validations, **spec}}


def vapb(actions: tuple[str, ...] = ("Deny",), name: str = "b", **spec: Any) -> Obj:
    return {"metadata": {"name": name}, "spec": {"policyName": "p",
                                                  "validationActions": list(actions), **spec}}


def pod(labels: dict[str, str] | None = None, replicas: int = 1) -> Obj:
    return {"metadata": {"name": "web", "namespace": "default", "labels": labels or {}},
            "spec": {"replicas": replicas}}


class TestAdmissionSemantics:
    def test_message_falls_back_from_expression_to_message_to_the_expression(self) -> None:
        base = {"expression": "object.spec.replicas <= 5"}
        cases = [
            ({**base, "messageExpression": "'too many: ' + string(object.spec.replicas)"},
             "too many: 9"),
            ({**base, "messageExpression": "1 + 1", "message": "fixed"}, "fixed"),  # not a string
            ({**base, "messageExpression": "'a\\nb'", "message": "fixed"}, "fixed"),  # newline
            (base, "failed expression: object.spec.replicas <= 5"),
        ]
        for validation, message in cases:
            got = check("CREATE", pod(replicas=9), None, ADMIN, [vap([validation])], [vapb()],
                        res=PODS)
            assert got == ('pods "web" is forbidden: ValidatingAdmissionPolicy \'p\' with '
                           f"binding 'b' denied request: {message}"), got
        assert check("CREATE", pod(replicas=2), None, ADMIN, [vap([base])], [vapb()],
                     res=PODS) == ["allowed"]

    def test_reason_sets_the_code(self) -> None:
        a = admission.Attributes("CREATE", PODS, "web", "default", pod(replicas=9), None, ADMIN)
        with pytest.raises(admission.Denied) as e:
            admission.validate([vap([{"expression": "false", "reason": "Forbidden"}])],
                               [vapb()], a)
        assert (e.value.code, e.value.reason) == (403, "Forbidden")
        with pytest.raises(admission.Denied) as e:
            admission.validate([vap([{"expression": "false"}])], [vapb()], a)
        assert (e.value.code, e.value.reason) == (422, "Invalid")

    def test_validation_actions_and_bindings(self) -> None:
        policy = vap([{"expression": "false", "message": "no"}])
        assert check("CREATE", pod(), None, ADMIN, [policy], [vapb(("Warn",))], res=PODS) == [
            "allowed", "Validation failed for ValidatingAdmissionPolicy 'p' with binding 'b': "
                       "no"]
        assert check("CREATE", pod(), None, ADMIN, [policy], [vapb(("Audit",))],
                     res=PODS) == ["allowed"]
        assert check("CREATE", pod(), None, ADMIN, [policy], [], res=PODS) == ["allowed"]
        only_labelled = vapb(matchResources={"objectSelector": {"matchLabels": {"x": "y"}}})
        assert check("CREATE", pod(), None, ADMIN, [policy], [only_labelled],
                     res=PODS) == ["allowed"]
        assert "denied request: no" in check("CREATE", pod({"x": "y"}), None, ADMIN, [policy],
                                             [only_labelled], res=PODS)

    def test_match_conditions_and_failure_policy(self) -> None:
        admins = {"name": "notAdmin",
                  "expression": "request.userInfo.username != 'kubernetes-admin'"}
        policy = vap([{"expression": "false", "message": "no"}], matchConditions=[admins])
        assert check("CREATE", pod(), None, ADMIN, [policy], [vapb()], res=PODS) == ["allowed"]
        broken = {"name": "broken", "expression": "object.nope == 1"}
        failing = vap([{"expression": "true"}], matchConditions=[broken])
        got = check("CREATE", pod(), None, ADMIN, [failing], [vapb()], res=PODS)
        assert isinstance(got, str) and "denied request: expression 'object.nope == 1' " \
            "resulted in error: " in got
        ignoring = vap([{"expression": "true"}], matchConditions=[broken],
                       failurePolicy="Ignore")
        assert check("CREATE", pod(), None, ADMIN, [ignoring], [vapb()], res=PODS) == [
            "allowed"]
        erroring = vap([{"expression": "object.nope == 1"}], failurePolicy="Ignore")
        assert check("CREATE", pod(), None, ADMIN, [erroring], [vapb()], res=PODS) == [
            "allowed"]
        optional = vap([{"expression": "object.spec.?replicas.orValue(0) < 5"}])
        got = check("CREATE", pod(), None, ADMIN, [optional], [vapb()], res=PODS)
        assert isinstance(got, str) and "denied request: compilation failed: " in got

    def test_a_failing_variable_fails_the_expressions_using_it(self) -> None:
        policy = vap([{"expression": "variables.r < 5"}, {"expression": "variables.ok"}],
                     variables=[{"name": "r", "expression": "object.spec.nope"},
                                {"name": "ok", "expression": "true"}])
        got = check("CREATE", pod(), None, ADMIN, [policy], [vapb()], res=PODS)
        assert isinstance(got, str) and got.split("denied request: ")[1].startswith(
            "expression 'variables.r < 5' resulted in error: composited variable \"r\" fails "
            "to evaluate: expression 'object.spec.nope' resulted in error: ")

    @pytest.mark.parametrize("rule, op, sub, matches", [
        ({"operations": ["CREATE"], "resources": ["pods"]}, "CREATE", "", True),
        ({"operations": ["CREATE"], "resources": ["pods"]}, "UPDATE", "", False),
        ({"operations": ["*"], "resources": ["pods"]}, "UPDATE", "status", False),
        ({"operations": ["*"], "resources": ["pods/status"]}, "UPDATE", "status", True),
        ({"operations": ["*"], "resources": ["pods/*"]}, "UPDATE", "status", True),
        ({"operations": ["*"], "resources": ["*/status"]}, "UPDATE", "status", True),
        ({"operations": ["*"], "resources": ["*"]}, "UPDATE", "status", False),
        ({"operations": ["*"], "resources": ["*/*"]}, "UPDATE", "status", True),
        ({"operations": ["*"], "resources": ["pods"], "scope": "Cluster"}, "CREATE", "", False),
        ({"operations": ["*"], "resources": ["pods"], "resourceNames": ["db"]}, "CREATE", "",
         False),
    ])
    def test_resource_rules(self, rule: Obj, op: str, sub: str, matches: bool) -> None:
        a = admission.Attributes(op, PODS, "web", "default", pod(), pod(), ADMIN, sub)
        full = {"apiGroups": [""], "apiVersions": ["*"], **rule}
        assert admission.resources_match({"resourceRules": [full]}, a, None) is matches
        if matches:  # the same rule in excludeResourceRules takes the request out again
            excluded = {"resourceRules": [full], "excludeResourceRules": [full]}
            assert not admission.resources_match(excluded, a, None)

    def test_namespace_selector_and_match_policy(self) -> None:
        a = admission.Attributes("CREATE", PODS, "web", "ml", pod(), None, ADMIN)
        rule = {"apiGroups": [""], "apiVersions": ["v2"], "operations": ["*"],
                "resources": ["pods"]}
        ns = {"metadata": {"name": "ml", "labels": {"team": "ml"}}}
        sel = {"matchExpressions": [{"key": "team", "operator": "In", "values": ["ml"]}]}
        assert admission.resources_match({"resourceRules": [rule], "namespaceSelector": sel},
                                         a, ns)
        assert not admission.resources_match(
            {"resourceRules": [rule], "namespaceSelector": sel}, a,
            {"metadata": {"name": "ml"}})
        # Equivalent (the default) matches the request's version whatever the rule names
        assert not admission.resources_match({"resourceRules": [rule], "matchPolicy": "Exact"},
                                             a, ns)

    def test_a_policy_with_params_is_refused_as_misconfigured(self) -> None:
        policy = vap([{"expression": "true"}], paramKind={"apiVersion": "v1",
                                                          "kind": "ConfigMap"})
        assert check("CREATE", pod(), None, ADMIN, [policy], [vapb()], res=PODS) == (
            "pods \"web\" is forbidden: ValidatingAdmissionPolicy 'p' denied request: failed "
            "to configure policy: LAB STAND-IN: paramKind is not played")


# ------------------------------------------------------------------ on the nodes
def test_the_kubelet_package_carries_a_cel_the_nodes_python_can_import(tmp_path: Any) -> None:
    """The lab's kubelet package ships cel-python's pure-Python files and those of its
    dependencies (pendulum without its compiled extension: it falls back to its pure-Python
    code) beside the stand-ins: a Python without site-packages, and without a system time zone
    database, evaluates a policy expression with them."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.lab import debs

    pkg = next(p for p in debs.load_definitions() if p.path.name == "kubelet.yaml")
    raw = {**pkg.raw, "files": [f for f in pkg.raw["files"] if "fetched" not in f]}
    spec = debs.render(debs.PackageDef(pkg.path, raw), "1.36.2-1.1")
    for e in spec.entries:
        if e.data is not None:
            target = tmp_path / e.dest.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(e.data)
    libdir = tmp_path / "usr/lib/gpuk8s-lab/kubelet"
    assert not list(libdir.rglob("*.so")) and (libdir / "celpy/cel.lark").is_file()
    code = ("from k8s import admission\n"
            "print(admission.evaluate(\"has(o.spec.nodeName) ? o.spec.nodeName : ''\", "
            "{'o': admission._to_cel({'spec': {'nodeName': 'gpu-01'}})}))\n"
            "import pendulum.helpers, sys\n"
            "print(pendulum.helpers.precise_diff.__module__)\n"
            "print(all(m.__file__.startswith(sys.argv[1]) for n, m in sys.modules.items()\n"
            "          if n.split('.')[0] in ('celpy', 'lark', 'pendulum', 'dateutil')))\n")
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(libdir),
           "PYTHONTZPATH": str(tmp_path / "no-zoneinfo")}
    out = subprocess.run([sys.executable, "-S", "-c", code, str(libdir)], env=env,
                         capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert out.split() == ["gpu-01", "pendulum._helpers", "True"]
    assert Path(libdir / "k8s/admission.py").is_file()
