# LAB STAND-IN: not the real kube-apiserver. Test infrastructure for gpuk8s; never shipped to users.
"""ServiceAccount tokens and RBAC for the stand-in API server.

Tokens: what the TokenRequest API (``POST .../serviceaccounts/<name>/token``) hands out and the
ServiceAccount authenticator accepts, with the real token's claims (iss, sub, aud, exp, jti, and
the ``kubernetes.io`` claim naming the namespace, ServiceAccount, pod and, for a token bound to a
pod, the pod's node: kubernetes pkg/serviceaccount/claims.go Claims, ServiceAccountTokenPodNodeInfo
GA and locked on since 1.32). The authenticated user is the real one (claims.go Validate,
k8s.io/apiserver pkg/authentication/serviceaccount/util.go@kubernetes-1.34.0 UserInfo): the
ServiceAccount's username, uid and groups, and in ``extra`` the bound pod's
authentication.kubernetes.io/pod-name and pod-uid, its node's node-name and node-uid, and
credential-id ``JTI=<jti>`` (pkg/authentication/token/jwt CredentialIDForJTI), which
ValidatingAdmissionPolicies read as ``request.userInfo.extra``. LAB SIMPLIFICATION:
the real API server signs them RS256 with --service-account-signing-key-file (sa.key) and checks
them with sa.pub; the stand-in signs them HS256 with a key derived from the same sa.key, so
every control plane of a cluster (they share sa.key) accepts the others' tokens, as the real
ones do. A token is refused (401) when its signature, expiry, ServiceAccount (uid) or bound pod
(uid) no longer holds.

RBAC: the rules of the Roles and ClusterRoles bound to a user, its groups or its ServiceAccount,
matched as the real authorizer does (plugin/pkg/auth/authorizer/rbac/rbac.go: apiGroups,
resources with their subresource as "<resource>/<subresource>", verbs, resourceNames; "*"
matches any), so a missing rule answers the real 403 text.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

Obj = dict[str, Any]

ISSUER = "https://kubernetes.default.svc.cluster.local"
#: the groups every ServiceAccount is in (k8s.io/apiserver/pkg/authentication/serviceaccount)
SA_GROUPS = ("system:serviceaccounts", "system:authenticated")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def signing_key(sa_key_pem: bytes) -> bytes:
    return hashlib.sha256(b"gpuk8s-lab service account tokens\0" + sa_key_pem).digest()


def issue(key: bytes, namespace: str, sa: Obj, seconds: int, pod: Obj | None = None,
          node: Obj | None = None, audiences: Iterable[str] = ()) -> tuple[str, int]:
    """A token for ServiceAccount ``sa`` (bound to ``pod`` when given): (token, expiry)."""
    now = int(time.time())
    exp = now + max(600, int(seconds))
    k8s: Obj = {"namespace": namespace,
                "serviceaccount": {"name": sa["metadata"]["name"],
                                   "uid": sa["metadata"].get("uid", "")}}
    if pod is not None:
        k8s["pod"] = {"name": pod["metadata"]["name"], "uid": pod["metadata"].get("uid", "")}
    if node is not None:
        k8s["node"] = {"name": node["metadata"]["name"], "uid": node["metadata"].get("uid", "")}
    claims = {"aud": list(audiences) or [ISSUER], "exp": exp, "iat": now, "nbf": now,
              "iss": ISSUER, "jti": str(uuid.uuid4()), "kubernetes.io": k8s,
              "sub": f"system:serviceaccount:{namespace}:{sa['metadata']['name']}"}
    head = _b64(json.dumps({"alg": "HS256", "kid": "gpuk8s-lab"}).encode())
    body = _b64(json.dumps(claims, separators=(",", ":")).encode())
    sig = _b64(hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest())
    return f"{head}.{body}.{sig}", exp


def claims(key: bytes, token: str) -> Obj | None:
    """The claims of a token this cluster signed and that has not expired, else None."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    want = _b64(hmac.new(key, f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest())
    if not hmac.compare_digest(want, parts[2]):
        return None
    try:
        got = json.loads(_unb64(parts[1]))
    except ValueError:
        return None
    if not isinstance(got, dict) or int(got.get("exp", 0)) <= time.time():
        return None
    return got


def user_of(c: Obj) -> tuple[str, list[str]]:
    ns = c["kubernetes.io"]["namespace"]
    return c["sub"], [SA_GROUPS[0], f"system:serviceaccounts:{ns}", SA_GROUPS[1]]


#: the keys of a ServiceAccount user's extra (util.go PodNameKey ... NodeUIDKey; user.go
#: CredentialIDKey)
POD_NAME, POD_UID = "authentication.kubernetes.io/pod-name", "authentication.kubernetes.io/pod-uid"
NODE_NAME = "authentication.kubernetes.io/node-name"
NODE_UID = "authentication.kubernetes.io/node-uid"
CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"


def extra_of(c: Obj) -> dict[str, list[str]]:
    """The user's extra from a token's claims (ServiceAccountInfo.UserInfo): the pod's name and
    uid when it is bound to one, the node's name (and uid, when known) when the token names a
    node, the credential id of its jti."""
    k8s = c.get("kubernetes.io") or {}
    out: dict[str, list[str]] = {}
    pod, node = k8s.get("pod") or {}, k8s.get("node") or {}
    if pod.get("name") and pod.get("uid"):
        out[POD_NAME], out[POD_UID] = [pod["name"]], [pod["uid"]]
    if c.get("jti"):
        out[CREDENTIAL_ID] = [f"JTI={c['jti']}"]
    if node.get("name"):
        out[NODE_NAME] = [node["name"]]
        if node.get("uid"):
            out[NODE_UID] = [node["uid"]]
    return out


# ------------------------------------------------------------------ authorization
def rule_allows(rule: Obj, group: str, resource: str, verb: str, name: str) -> bool:
    groups, resources, verbs = (rule.get("apiGroups") or [], rule.get("resources") or [],
                                rule.get("verbs") or [])
    names = rule.get("resourceNames") or []
    return ((group in groups or "*" in groups) and
            (resource in resources or "*" in resources or
             ("/" in resource and f"*/{resource.split('/', 1)[1]}" in resources)) and
            (verb in verbs or "*" in verbs) and (not names or name in names))


def subject_matches(subject: Obj, user: str, groups: list[str], binding_ns: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return name == user
    if kind == "Group":
        return name in groups
    if kind == "ServiceAccount":
        return user == f"system:serviceaccount:{subject.get('namespace') or binding_ns}:{name}"
    return False


def allows(user: str, groups: list[str], verb: str, group: str, resource: str, ns: str,
           name: str, bindings: Callable[[str | None], list[Obj]],
           role: Callable[[str, str, str], Obj | None]) -> bool:
    """Whether a ClusterRoleBinding, or a RoleBinding of ``ns``, grants the request.
    ``bindings(None)`` lists ClusterRoleBindings, ``bindings(ns)`` a namespace's RoleBindings;
    ``role(kind, ns, name)`` reads a Role or ClusterRole."""
    scopes: list[str | None] = [None] + ([ns] if ns else [])
    for scope in scopes:
        for b in bindings(scope):
            if not any(subject_matches(s, user, groups, scope or "")
                       for s in b.get("subjects") or []):
                continue
            ref = b.get("roleRef") or {}
            r = role(str(ref.get("kind", "")), scope or "", str(ref.get("name", "")))
            if r and any(rule_allows(rule, group, resource, verb, name)
                         for rule in r.get("rules") or []):
                return True
    return False
