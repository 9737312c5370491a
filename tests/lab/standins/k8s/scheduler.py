# LAB STAND-IN: not the real kube-scheduler. Test infrastructure for gpuk8s; never shipped to users.
"""Scheduling filters of the default scheduler (subset) and its FailedScheduling message.

Filter order as in the default profile: NodeUnschedulable, NodeName, TaintToleration, NodeAffinity,
NodeResourcesFit, then DynamicResources (dra_server.py gives it as ``extra``). Each node reports
the first failing plugin; the message counts nodes per reason, sorts the "<count> <reason>"
strings and appends the PostFilter summary, as k8s.io/kubernetes/pkg/scheduler/framework
FitError.Error() does. The texts are those of 1.34+ (the lab's 1.35/1.36): TaintToleration names
no taint, and DynamicResources' PostFilter speaks before DefaultPreemption for every pod ("no new
claims to deallocate" for a pod without claims, dra_server.py gives it).
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from typing import Any

from .common import parse_quantity

Obj = dict[str, Any]

NOT_HELPFUL = "Preemption is not helpful for scheduling"
NO_VICTIMS = "No preemption victims found for incoming pod"
DEFAULT_PODS = 110


def tolerates(tolerations: list[Obj], taint: Obj) -> bool:
    for t in tolerations or []:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        op = t.get("operator", "Equal")
        if not t.get("key"):
            if op == "Exists":
                return True
            continue
        if t["key"] != taint.get("key"):
            continue
        if op == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def untolerated_taint(pod: Obj, node: Obj, effects: tuple[str, ...] = ("NoSchedule", "NoExecute")
                      ) -> Obj | None:
    tols = pod.get("spec", {}).get("tolerations") or []
    for taint in node.get("spec", {}).get("taints") or []:
        if taint.get("effect") in effects and not tolerates(tols, taint):
            return taint
    return None


def _match_expr(expr: Obj, value: str | None) -> bool:
    op, vals = expr.get("operator"), expr.get("values") or []
    if op == "In":
        return value is not None and value in vals
    if op == "NotIn":
        return value is None or value not in vals
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and vals:
        try:
            a, b = int(value), int(vals[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def matches_node_selector(pod: Obj, node: Obj) -> bool:
    labels = node.get("metadata", {}).get("labels") or {}
    spec = pod.get("spec", {})
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    req = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
           .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = req.get("nodeSelectorTerms") or []
    if not terms:
        return True
    fields = {"metadata.name": node["metadata"]["name"]}
    for term in terms:  # terms are ORed, expressions inside a term are ANDed
        exprs = term.get("matchExpressions") or []
        fexprs = term.get("matchFields") or []
        if not exprs and not fexprs:
            continue
        if all(_match_expr(e, labels.get(e.get("key"))) for e in exprs) and all(
                _match_expr(e, fields.get(e.get("key"))) for e in fexprs):
            return True
    return False


def pod_requests(pod: Obj) -> dict[str, Fraction]:
    """Effective requests: sum over containers (limits stand in for missing requests), at least
    the largest init container."""
    def one(c: Obj) -> dict[str, Fraction]:
        res = c.get("resources") or {}
        merged = dict(res.get("limits") or {})
        merged.update(res.get("requests") or {})
        return {k: parse_quantity(v) for k, v in merged.items()}

    spec = pod.get("spec", {})
    total: dict[str, Fraction] = {}
    for c in spec.get("containers") or []:
        for k, v in one(c).items():
            total[k] = total.get(k, Fraction(0)) + v
    for c in spec.get("initContainers") or []:
        for k, v in one(c).items():
            total[k] = max(total.get(k, Fraction(0)), v)
    return total


def is_active(pod: Obj) -> bool:
    return pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")


def node_free(node: Obj, pods: list[Obj]) -> tuple[dict[str, Fraction], int]:
    alloc = {k: parse_quantity(v) for k, v in (node.get("status", {}).get("allocatable") or {})
             .items()}
    name = node["metadata"]["name"]
    used_pods = 0
    for p in pods:
        if p.get("spec", {}).get("nodeName") != name or not is_active(p):
            continue
        used_pods += 1
        for k, v in pod_requests(p).items():
            alloc[k] = alloc.get(k, Fraction(0)) - v
    max_pods = int(alloc.pop("pods", DEFAULT_PODS))
    return alloc, max_pods - used_pods


def filter_node(pod: Obj, node: Obj, pods: list[Obj]) -> tuple[list[str], bool]:
    """([] , _) when the pod fits; else (reasons, resolvable_by_preemption)."""
    spec = pod.get("spec", {})
    nspec = node.get("spec", {})
    if nspec.get("unschedulable"):
        unsched = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
        if not tolerates(spec.get("tolerations") or [], unsched):
            return ["node(s) were unschedulable"], False
    if spec.get("nodeName") and spec["nodeName"] != node["metadata"]["name"]:
        return ["node(s) didn't match the requested node name"], False
    if untolerated_taint(pod, node) is not None:
        # 1.34+ names no taint (older releases printed "untolerated taint {key: value}")
        return ["node(s) had untolerated taint(s)"], False
    if not matches_node_selector(pod, node):
        return ["node(s) didn't match Pod's node affinity/selector"], False
    free, free_pods = node_free(node, pods)
    reasons = []
    if free_pods < 1:
        reasons.append("Too many pods")
    for res, want in sorted(pod_requests(pod).items()):
        if want <= 0:
            continue
        if free.get(res, Fraction(0)) < want:
            reasons.append(f"Insufficient {res}")
    return reasons, True


def fit_error(n_nodes: int, per_node: list[tuple[list[str], bool]], postfilter: str = "",
              prefilter: str = "") -> str:
    """FitError.Error(): a PreFilter failure replaces the per-node histogram (every node is then
    unresolvable); a PostFilter plugin's reasons (DynamicResources' "still not schedulable")
    come before DefaultPreemption's."""
    counts: Counter[str] = Counter()
    pre: Counter[str] = Counter()
    for reasons, resolvable in per_node:
        for r in reasons:
            counts[r] += 1
        pre[NO_VICTIMS if resolvable and not prefilter else NOT_HELPFUL] += 1
    reasons_s = prefilter or ", ".join(sorted(f"{v} {k}" for k, v in counts.items()))
    msg = f"0/{n_nodes} nodes are available"
    msg += f": {reasons_s}." if reasons_s else "."
    pre_s = ", ".join(sorted(f"{v} {k}" for k, v in pre.items()))
    if pre_s:
        msg += f" {postfilter + ', ' if postfilter else ''}preemption: 0/{n_nodes} nodes are " \
               f"available: {pre_s}."
    return msg


def _score(pod: Obj, node: Obj, pods: list[Obj]) -> tuple[Fraction, str]:
    free, _ = node_free(node, pods)
    alloc = node.get("status", {}).get("allocatable") or {}
    score = Fraction(0)
    for res in ("cpu", "memory"):
        total = parse_quantity(alloc.get(res, "0"))
        if total > 0:
            score += free.get(res, Fraction(0)) / total
    return (-score, node["metadata"]["name"])


def schedule(pod: Obj, nodes: list[Obj], pods: list[Obj], extra: Any = None,
             postfilter: str = "", prefilter: str = "") -> tuple[str | None, str]:
    """Pick a node (LeastAllocated-like) or return the FailedScheduling message. ``extra``
    (node -> reason or None) is a filter after the others whose failures preemption cannot
    help (DynamicResources, dra_server.py); ``prefilter`` a PreFilter failure of the pod."""
    if not nodes:
        return None, "no nodes available to schedule pods"
    if prefilter:
        return None, fit_error(len(nodes), [([], False) for _ in nodes], postfilter, prefilter)
    results = []
    for n in nodes:
        reasons, resolvable = filter_node(pod, n, pods)
        if not reasons and extra is not None and (why := extra(n)):
            reasons, resolvable = [why], False
        results.append((n, reasons, resolvable))
    feasible = [n for n, reasons, _ in results if not reasons]
    if feasible:
        best = min(feasible, key=lambda n: _score(pod, n, pods))
        return best["metadata"]["name"], ""
    return None, fit_error(len(nodes), [(r, ok) for _, r, ok in results], postfilter)
