# LAB STAND-IN: not the real kube-apiserver. Test infrastructure for gpuk8s; never shipped to users.
"""ValidatingAdmissionPolicy for the stand-in API server (admissionregistration.k8s.io/v1, GA
since Kubernetes 1.30): the API server serves ValidatingAdmissionPolicies and their Bindings and
checks every create, update and delete a client sends against them, with a real CEL
implementation (cel-python, import name `celpy`).

What is upstream's (k8s.io/apiserver@kubernetes-1.34.0, pkg/admission/plugin/policy/validating,
pkg/admission/plugin/webhook/matchconditions, pkg/admission/plugin/cel, pkg/admission/errors.go;
unchanged to 1.36):
- a policy applies when its `matchConstraints` match the request (resourceRules and
  excludeResourceRules: operations, apiGroups, apiVersions, resources with `*`, `*/*`,
  `<res>/*`, `*/<sub>` and `<res>/<sub>`, resourceNames, scope; namespaceSelector and
  objectSelector; matchPolicy Equivalent: any version of the group and resource), and each of
  its Bindings (`spec.policyName`) whose `matchResources` match (all, when unset) runs it;
- its `matchConditions` must all be true, else the request is not checked; one that fails to
  evaluate denies the request under failurePolicy Fail (the default) and skips it under Ignore
  (matcher.go Match);
- its `variables` are evaluated in order (each sees the earlier ones as `variables.<name>`);
  one that fails makes every expression using it fail with `composited variable "<name>" fails
  to evaluate: <error>` (composition.go);
- each `validations[]` expression must be true; when it is false the message is the
  `messageExpression`'s value (a string of at most 5 KiB without a newline, trimmed), else the
  `message`, else `failed expression: <expression>`; the reason is the validation's `reason`
  (default Invalid); an expression that fails to evaluate gives `expression '<expression>'
  resulted in error: <error>` and denies under failurePolicy Fail (validator.go Validate,
  activation.go);
- the Binding's `validationActions`: Deny refuses the request, Warn adds the warning
  `Validation failed for ValidatingAdmissionPolicy '<p>' with binding '<b>': <message>`, Audit
  only annotates the audit event (the lab has no audit log);
- the refusal is the first denial: `<resource>.<group> "<name>" is forbidden:
  ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied request: <message>`
  (dispatcher.go Dispatch; admission.NewForbidden, apimachinery errors.NewForbidden), with the
  reason's code (reasonToCode: Invalid 422, Forbidden 403, Unauthorized 401,
  RequestEntityTooLarge 413) and the message again as the only cause, so the real kubectl
  prints `The <resource> "<name>" is invalid: : ValidatingAdmissionPolicy ...`;
- the CEL variables: `object` (null on DELETE), `oldObject` (null on CREATE), `request` (the
  AdmissionRequest: kind, resource, subResource, requestKind, requestResource, name, namespace,
  operation, userInfo {username, uid, groups, extra} with empty fields left out, dryRun; the
  extra of a pod-bound ServiceAccount token holds authentication.kubernetes.io/pod-name,
  pod-uid, node-name, node-uid and credential-id), `namespaceObject`, `params` (null),
  `variables` (condition.go CreateAdmissionRequest).

What is the lab's: admission runs for the requests clients send (its own controllers write
directly, as if they were system components no policy names); CEL is cel-python's, so there is
no type-checking when a policy is written (a misspelt field fails when the expression runs, under
failurePolicy, instead of a warning in status.typeChecking), error details are cel-python's text,
and neither CEL's optional types (`?.`, `[?`, `orValue`) nor the Kubernetes CEL libraries
(`authorizer`, quantities, ...) exist: such an expression fails to compile and failurePolicy
applies; policies with a paramKind and auditAnnotations are not played (a paramKind policy
fails as misconfigured: failurePolicy decides).
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from typing import Any

from .resources import Resource

Obj = dict[str, Any]
GROUP = "admissionregistration.k8s.io"
POLICY = Resource(GROUP, "v1", "ValidatingAdmissionPolicy", "validatingadmissionpolicies", False)
BINDING = Resource(GROUP, "v1", "ValidatingAdmissionPolicyBinding",
                   "validatingadmissionpolicybindings", False)
#: celconfig.MaxEvaluatedMessageExpressionSizeBytes (k8s.io/apiserver pkg/apis/cel/config.go)
MAX_MESSAGE = 5 * 1024
#: policy_decision.go reasonToCode
CODES = {"Forbidden": 403, "Unauthorized": 401, "RequestEntityTooLarge": 413, "Invalid": 422}
#: cel-python's error texts can hold its whole activation: the lab cuts them
MAX_ERROR = 300


def register(registry: Any) -> None:
    """Serve ValidatingAdmissionPolicy and ValidatingAdmissionPolicyBinding."""
    registry.add(POLICY)
    registry.add(BINDING)


@dataclass(frozen=True)
class UserInfo:
    """Who sends a request, as the authenticators give it (user.Info)."""

    username: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: dict[str, list[str]] = field(default_factory=dict)

    def as_request(self) -> Obj:
        """authenticationv1.UserInfo as JSON: empty fields are left out (omitempty)."""
        out: Obj = {"username": self.username}
        if self.uid:
            out["uid"] = self.uid
        if self.groups:
            out["groups"] = list(self.groups)
        if self.extra:
            out["extra"] = {k: list(v) for k, v in self.extra.items()}
        return out


@dataclass
class Attributes:
    """One request as admission sees it (admission.Attributes)."""

    operation: str  # CREATE, UPDATE or DELETE
    res: Resource
    name: str
    namespace: str
    obj: Obj | None
    old: Obj | None
    user: UserInfo
    subresource: str = ""
    dry_run: bool = False


class Denied(Exception):
    """The request is refused: the API server answers ``status()``."""

    def __init__(self, code: int, reason: str, message: str, details: Obj) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


@dataclass
class _Decision:
    message: str
    reason: str = "Invalid"


# ------------------------------------------------------------------ matching
def selector_matches(sel: Obj | None, labels: dict[str, str]) -> bool:
    """metav1.LabelSelector; unset or {} matches everything."""
    if not sel:
        return True
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in sel.get("matchExpressions") or []:
        has, vals, op = labels.get(e.get("key", "")), e.get("values") or [], e.get("operator")
        if (op == "In" and has not in vals) or (op == "NotIn" and has in vals) or (
                op == "Exists" and has is None) or (op == "DoesNotExist" and has is not None):
            return False
    return True


def _resource_matches(patterns: list[str], plural: str, sub: str) -> bool:
    for p in patterns:
        res, _, psub = p.partition("/")
        if p == "*/*":
            return True
        if "/" not in p:
            if not sub and res in ("*", plural):
                return True
            continue
        if res in ("*", plural) and psub in ("*", sub) and sub:
            return True
    return False


def rule_matches(rule: Obj, a: Attributes, exact: bool, operations: bool = True) -> bool:
    """A NamedRuleWithOperations against the request (rules.go Matcher)."""
    if operations:
        ops = rule.get("operations") or []
        if "*" not in ops and a.operation not in ops:
            return False
    groups, versions = rule.get("apiGroups") or [], rule.get("apiVersions") or []
    if "*" not in groups and a.res.group not in groups:
        return False
    if exact and "*" not in versions and a.res.version not in versions:
        return False
    if not _resource_matches(rule.get("resources") or [], a.res.plural, a.subresource):
        return False
    scope = rule.get("scope") or "*"
    if (scope == "Cluster" and a.res.namespaced) or (scope == "Namespaced" and
                                                     not a.res.namespaced):
        return False
    names = rule.get("resourceNames") or []
    return not names or a.name in names


def resources_match(spec: Obj | None, a: Attributes, namespace: Obj | None) -> bool:
    """A policy's matchConstraints or a binding's matchResources (matching.go Matches)."""
    if spec is None:
        return True
    labels = lambda o: ((o or {}).get("metadata") or {}).get("labels") or {}  # noqa: E731
    if a.res.namespaced:
        if not selector_matches(spec.get("namespaceSelector"), labels(namespace)):
            return False
    elif a.res.plural == "namespaces" and not selector_matches(
            spec.get("namespaceSelector"), labels(a.obj or a.old)):
        return False
    objsel = spec.get("objectSelector")
    if objsel and not any(o is not None and selector_matches(objsel, labels(o))
                          for o in (a.obj, a.old)):
        return False
    exact = spec.get("matchPolicy") == "Exact"
    rules = spec.get("resourceRules")
    if rules is not None and not any(rule_matches(r, a, exact) for r in rules):
        return False
    return not any(rule_matches(r, a, exact) for r in spec.get("excludeResourceRules") or [])


# ------------------------------------------------------------------ CEL
_PROGRAMS: dict[str, Any] = {}


class CelError(Exception):
    pass


def _program(expr: str) -> Any:
    if expr not in _PROGRAMS:
        env = _celpy().Environment()
        try:
            _PROGRAMS[expr] = env.program(env.compile(expr))
        except Exception as e:  # celpy.CELParseError: the text and a caret under the error
            raise CelError("compilation failed: " + _short(e)) from None
    return _PROGRAMS[expr]


def _short(e: BaseException) -> str:
    text = str(e.args[0]) if e.args else str(e)
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR else text[:MAX_ERROR] + "..."


def evaluate(expr: str, activation: Obj) -> Any:
    """The value of ``expr`` (celpy types), or CelError with the real wrapping of the error."""
    try:
        prog = _program(expr)
    except CelError as e:
        raise CelError(str(e)) from None
    try:
        return prog.evaluate(activation)
    except Exception as e:
        raise CelError(f"expression '{expr}' resulted in error: {_short(e)}") from None


def _celpy() -> Any:
    """cel-python (the nodes carry its pure-Python files beside the stand-ins)."""
    with warnings.catch_warnings():  # lark 0.12 imports sre_parse (deprecated in 3.11)
        warnings.simplefilter("ignore", DeprecationWarning)
        import celpy
    return celpy


def _to_cel(value: Any) -> Any:
    return _celpy().json_to_cel(value)


def _truth(value: Any) -> bool | None:
    return bool(value) if isinstance(value, _celpy().celtypes.BoolType) else None


def request_of(a: Attributes) -> Obj:
    """The AdmissionRequest the expressions see as `request` (CreateAdmissionRequest)."""
    gvk = {"group": a.res.group, "version": a.res.version, "kind": a.res.kind}
    gvr = {"group": a.res.group, "version": a.res.version, "resource": a.res.plural}
    out: Obj = {"kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
                "operation": a.operation, "userInfo": a.user.as_request(), "dryRun": a.dry_run,
                "uid": ""}
    for key, value in (("subResource", a.subresource), ("requestSubResource", a.subresource),
                       ("name", a.name), ("namespace", a.namespace)):
        if value:
            out[key] = value
    return out


def _uses(expr: str, name: str) -> bool:
    return re.search(rf"\bvariables\s*\.\s*{re.escape(name)}\b", expr) is not None


def _validate(policy: Obj, a: Attributes, namespace: Obj | None) -> list[_Decision] | None:
    """The policy's failing validations for this request ([] when it passes; None when its
    matchConditions leave the request unchecked). CelError: a match condition failed to
    evaluate (failurePolicy decides)."""
    spec = policy.get("spec") or {}
    fail = (spec.get("failurePolicy") or "Fail") != "Ignore"
    act: Obj = {"object": _to_cel(a.obj), "oldObject": _to_cel(a.old),
                "request": _to_cel(request_of(a)), "params": _to_cel(None),
                "namespaceObject": _to_cel(namespace)}
    errors = []
    for cond in spec.get("matchConditions") or []:
        try:
            got = _truth(evaluate(cond.get("expression", ""), act))
        except CelError as e:
            errors.append(str(e))
            continue
        if got is False:
            return None
        if got is None:
            errors.append(f"expression '{cond.get('expression')}' did not evaluate to a bool "
                          "(LAB STAND-IN: no type-checking)")
    if errors:
        if not fail:
            return None
        return [_Decision("; ".join(errors) if len(errors) == 1 else
                          "[" + ", ".join(errors) + "]")]
    celtypes = _celpy().celtypes
    values: dict[Any, Any] = {}
    failed: dict[str, str] = {}
    for var in spec.get("variables") or []:
        name = str(var.get("name", ""))
        act["variables"] = celtypes.MapType(values)
        bad = next((n for n in failed if _uses(var.get("expression", ""), n)), None)
        try:
            if bad is not None:
                raise CelError(failed[bad])
            values[celtypes.StringType(name)] = evaluate(var.get("expression", ""), act)
        except CelError as e:
            failed[name] = f'composited variable "{name}" fails to evaluate: {e}'
    act["variables"] = celtypes.MapType(values)

    def run(expr: str) -> Any:
        bad = next((n for n in failed if _uses(expr, n)), None)
        if bad is not None:
            raise CelError(f"expression '{expr}' resulted in error: {failed[bad]}")
        return evaluate(expr, act)

    out = []
    for v in spec.get("validations") or []:
        expr = str(v.get("expression", ""))
        try:
            ok = _truth(run(expr))
            if ok is None:
                raise CelError(f"expression '{expr}' did not evaluate to a bool (LAB STAND-IN: "
                               "no type-checking)")
        except CelError as e:
            if fail:
                out.append(_Decision(str(e)))
            continue
        if ok:
            continue
        message = ""
        if v.get("messageExpression"):
            try:
                got = run(str(v["messageExpression"]))
                if isinstance(got, str):
                    message = str(got).strip()
                    if len(message.encode()) > MAX_MESSAGE or "\n" in message:
                        message = ""
            except CelError:
                message = ""
        if not message and (v.get("message") or "").strip():
            message = str(v["message"]).strip()
        if not message:
            message = f"failed expression: {expr.strip()}"
        out.append(_Decision(message, str(v.get("reason") or "Invalid")))
    return out


def validate(policies: list[Obj], bindings: list[Obj], a: Attributes,
             namespace: Obj | None = None) -> list[str]:
    """Run every matching policy through its bindings: the warnings to send, or Denied."""
    denied: list[tuple[str, str | None, _Decision]] = []
    warnings: list[str] = []
    for policy in sorted(policies, key=lambda p: p["metadata"]["name"]):
        pname = policy["metadata"]["name"]
        spec = policy.get("spec") or {}
        if not resources_match(spec.get("matchConstraints") or {"resourceRules": []}, a,
                               namespace):
            continue
        fail = (spec.get("failurePolicy") or "Fail") != "Ignore"
        if spec.get("paramKind"):
            if fail:
                denied.append((pname, None, _Decision(
                    "failed to configure policy: LAB STAND-IN: paramKind is not played")))
            continue
        for binding in sorted((b for b in bindings
                               if (b.get("spec") or {}).get("policyName") == pname),
                              key=lambda b: b["metadata"]["name"]):
            bspec = binding.get("spec") or {}
            if not resources_match(bspec.get("matchResources"), a, namespace):
                continue
            decisions = _validate(policy, a, namespace) or []
            actions = bspec.get("validationActions") or []
            for d in decisions:
                if "Deny" in actions:
                    denied.append((pname, binding["metadata"]["name"], d))
                if "Warn" in actions:
                    warnings.append(f"Validation failed for ValidatingAdmissionPolicy "
                                    f"'{pname}' with binding '{binding['metadata']['name']}': "
                                    f"{d.message}")
    if denied:
        pname, bname, d = denied[0]
        message = (f"ValidatingAdmissionPolicy '{pname}' with binding '{bname}' denied "
                   f"request: {d.message}" if bname else
                   f"ValidatingAdmissionPolicy '{pname}' denied request: {d.message}")
        name = a.name or ((a.obj or {}).get("metadata") or {}).get("name") or ((
            a.obj or {}).get("metadata") or {}).get("generateName") or "Unknown"
        qualified = f"{a.res.plural}.{a.res.group}" if a.res.group else a.res.plural
        raise Denied(CODES.get(d.reason, 422), d.reason,
                     f'{qualified} "{name}" is forbidden: {message}',
                     {"name": name, "group": a.res.group, "kind": a.res.plural,
                      "causes": [{"message": message}]})
    return warnings
