"""The lab's people as Kubernetes objects (pure: no session, no hosts).

The inventory names users and groups (``lab_users``, ``lab_groups``). Each user and each group
gets a namespace of its own name with:

- a ResourceQuota ``gpuk8s-quota``: ``gpu_quota`` of every GPU resource the cluster offers
  (``requests.nvidia.com/gpu``, time-sliced shares included, and each MIG profile's
  ``requests.nvidia.com/mig-<profile>``), plus ``pods``, ``requests.cpu`` and
  ``requests.memory`` when the entry sets them;
- a LimitRange ``gpuk8s-defaults``: a container that names no requests gets
  ``tenancy_default_*`` (so a quota on cpu or memory never refuses a pod for naming none);
- a RoleBinding ``gpuk8s-edit`` to the built-in ClusterRole ``edit``, in that namespace only:
  for a user's namespace the user, for a group's every member;
- Pod Security Admission's ``enforce`` label at ``tenancy_pod_security`` (baseline by default:
  ``edit`` may create pods, and a privileged pod or a hostPath volume is root on the node).

A user is a Kubernetes user name (the CN of the client certificate ``invoke user-kubeconfig``
makes), never a group of the certificate: what a user may do follows the inventory, not a
certificate already handed out.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuk8s.checks import DNS_LABEL, VarProblem, matching, show

#: the keys of a lab_users entry, and of a lab_groups entry
USER_KEYS = ("gpu_quota", "groups", "cpu", "memory", "pods", "admin")
GROUP_KEYS = ("gpu_quota", "cpu", "memory", "pods")
#: the objects gpuk8s keeps in each tenant namespace
QUOTA = "gpuk8s-quota"
LIMITS = "gpuk8s-defaults"
BINDING = "gpuk8s-edit"
COMPONENT = "tenancy"
#: the label that says which inventory entry a namespace belongs to: "user" or "group"
TENANT_LABEL = "gpuk8s.io/tenant"
#: namespaces a user or group may never be named after: Kubernetes' own, and those gpuk8s and
#: the add-ons it installs use (a tenant there would get edit on the add-on)
RESERVED = ("default", "jupyterhub", "ml", "kube-flannel", "calico-system", "calico-apiserver",
            "tigera-operator", "nvidia-dra-driver-gpu", "local-path-storage")
RESERVED_PREFIXES = ("kube-", "gpuk8s", "system", "nvidia-", "calico-", "tigera-")
#: Pod Security Admission levels (pod-security.kubernetes.io/enforce)
POD_SECURITY = ("privileged", "baseline", "restricted")

_DNS_LABEL = re.compile(DNS_LABEL)
#: a Kubernetes quantity as a quota or a LimitRange takes it: 4, 500m, 16Gi, 1.5
QUANTITY = re.compile(r"(\d+(\.\d+)?|\.\d+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_USERS_EXAMPLE = ("write lab_users: {alice: {gpu_quota: 2, groups: [vision]}, bob: {gpu_quota: "
                  "1}} (keys: " + ", ".join(USER_KEYS) + ")")
_GROUPS_EXAMPLE = ("write lab_groups: {vision: {gpu_quota: 4}} (keys: " +
                   ", ".join(GROUP_KEYS) + ")")


@dataclass(frozen=True)
class Tenant:
    """One namespace gpuk8s keeps for a user or a group."""

    name: str
    kind: str  # "user" | "group"
    gpu_quota: int
    #: the users bound to edit here: the user, or the group's members
    members: tuple[str, ...]
    cpu: str = ""
    memory: str = ""
    pods: int | None = None


#: tenancy_default_* (a Kubernetes quantity; the memory limit may be "": none)
check_quantity = matching(QUANTITY.pattern, "a Kubernetes quantity like 100m, 2, 256Mi or 8Gi",
                          '"256Mi"')
check_quantity_or_empty = matching(QUANTITY.pattern,
                                   "a Kubernetes quantity like 100m, 2, 256Mi or 8Gi",
                                   '"256Mi"', or_empty=True)


def name_problem(what: str, name: Any) -> str | None:
    """Why ``name`` cannot be a user or group (and so a namespace and a user name)."""
    if not isinstance(name, str) or not _DNS_LABEL.fullmatch(name):
        return (f"{what} {show(name)} is not a DNS-1123 label (at most 63 lower-case letters, "
                "digits and '-', starting and ending with a letter or digit): it names the "
                "namespace and the Kubernetes user")
    if name in RESERVED or name.startswith(RESERVED_PREFIXES):
        return (f"{what} {name!r} would take a namespace of Kubernetes, gpuk8s or an add-on "
                f"(reserved: {', '.join(RESERVED)} and names starting "
                f"{', '.join(RESERVED_PREFIXES)}); choose another name")
    return None


def _entry_problem(var: str, name: str, entry: Any, keys: tuple[str, ...],
                   example: str) -> VarProblem | None:
    if entry is None:
        entry = {}
    if not isinstance(entry, Mapping):
        return VarProblem(var, f"{var}: {name}: expected a mapping of {', '.join(keys)}, got "
                          f"{show(entry)}", example, subkey=name)
    for key in entry:
        if key not in keys:
            near = difflib.get_close_matches(str(key), keys, n=1, cutoff=0.6)
            hint = f" (did you mean {near[0]}?)" if near else ""
            return VarProblem(var, f"{var}: {name}: unknown key {show(key)}{hint}",
                              example, subkey=name)
    quota = entry.get("gpu_quota", 0)
    if isinstance(quota, bool) or not isinstance(quota, int) or quota < 0:
        return VarProblem(var, f"{var}: {name}: gpu_quota must be a whole number of GPUs, 0 "
                          f"or more, got {show(quota)}", example, subkey=name)
    pods = entry.get("pods")
    if pods is not None and (isinstance(pods, bool) or not isinstance(pods, int) or pods < 1):
        return VarProblem(var, f"{var}: {name}: pods must be a whole number, 1 or more, got "
                          f"{show(pods)}", example, subkey=name)
    for key in ("cpu", "memory"):
        value = entry.get(key)
        if value is not None and (isinstance(value, bool) or
                                  not QUANTITY.fullmatch(str(value))):
            return VarProblem(var, f"{var}: {name}: {key} must be a Kubernetes quantity "
                              f"(cpu: 8 or 500m; memory: 64Gi), got {show(value)}", example,
                              subkey=name)
    if "admin" in entry and not isinstance(entry["admin"], bool):
        return VarProblem(var, f"{var}: {name}: admin must be true or false, got "
                          f"{show(entry['admin'])}", example, subkey=name)
    groups = entry.get("groups", [])
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        return VarProblem(var, f"{var}: {name}: groups must be a list of lab_groups names, "
                          f"got {show(groups)}", example, subkey=name)
    return None


def _check_entries(name: str, value: Mapping[Any, Any], what: str, keys: tuple[str, ...],
                   example: str) -> VarProblem | None:
    for entry_name, entry in value.items():
        problem = name_problem(what, entry_name)
        if problem:
            return VarProblem(name, f"{name}: {problem}", example, subkey=str(entry_name))
        found = _entry_problem(name, entry_name, entry, keys, example)
        if found:
            return found
    return None


def check_lab_users(name: str, value: Mapping[Any, Any]) -> VarProblem | None:
    """{user: {gpu_quota, groups, cpu, memory, pods, admin}}: names DNS-1123 labels, not
    reserved; quotas whole and non-negative; unknown keys refused with a near name."""
    return _check_entries(name, value, "user", USER_KEYS, _USERS_EXAMPLE)


def check_lab_groups(name: str, value: Mapping[Any, Any]) -> VarProblem | None:
    """{group: {gpu_quota, cpu, memory, pods}}, named as users are."""
    return _check_entries(name, value, "group", GROUP_KEYS, _GROUPS_EXAMPLE)


def check_users_and_groups(values: Mapping[str, Any]) -> VarProblem | None:
    """lab_users against lab_groups: every group a user names exists, and no user and group
    share a name (they would share the namespace)."""
    users, groups = values.get("lab_users") or {}, values.get("lab_groups") or {}
    if not isinstance(users, Mapping) or not isinstance(groups, Mapping):
        return None  # their own checks name the problem
    for user, entry in users.items():
        listed = entry.get("groups", []) if isinstance(entry, Mapping) else []
        for group in listed if isinstance(listed, list) else []:
            if isinstance(group, str) and group not in groups:
                near = difflib.get_close_matches(group, list(groups), n=1, cutoff=0.6)
                hint = f" (did you mean {near[0]}?)" if near else ""
                return VarProblem("lab_users", f"lab_users: {user}: group {group!r} is not in "
                                  f"lab_groups{hint}", f"add {group} to lab_groups (e.g. "
                                  f"lab_groups: {{{group}: {{gpu_quota: 2}}}}) or remove it "
                                  f"from {user}'s groups", subkey=str(user),
                                  others=("lab_groups",))
    both = sorted(set(users) & set(groups))
    if both:
        return VarProblem("lab_users", f"lab_users and lab_groups both name {both[0]!r}: a "
                          "user and a group each get the namespace of their name",
                          "rename the group (e.g. team-" + both[0] + ")", subkey=both[0],
                          others=("lab_groups",))
    return None


def tenants(users: Mapping[str, Any], groups: Mapping[str, Any]) -> list[Tenant]:
    """Every namespace the inventory asks for: users, then groups, each sorted by name."""
    out = []
    for name in sorted(users):
        e = users[name] or {}
        out.append(Tenant(name, "user", int(e.get("gpu_quota", 0)), (name,),
                          str(e.get("cpu", "")), str(e.get("memory", "")), e.get("pods")))
    for name in sorted(groups):
        e = groups[name] or {}
        members = tuple(sorted(u for u in users if name in (users[u] or {}).get("groups", [])))
        out.append(Tenant(name, "group", int(e.get("gpu_quota", 0)), members,
                          str(e.get("cpu", "")), str(e.get("memory", "")), e.get("pods")))
    return out


def admins(users: Mapping[str, Any]) -> list[str]:
    """The users marked ``admin: true`` (JupyterHub's admins)."""
    return sorted(u for u, e in users.items() if (e or {}).get("admin"))


#: the quota name of the devices ResourceClaims ask of a DeviceClass
#: (pkg/quota/v1/evaluator/core/resource_claims.go@v1.36.2: <class>.deviceclass.resource.k8s.io/
#: devices, each claim counting the devices its requests may take)
DRA_QUOTA = "{}.deviceclass.resource.k8s.io/devices"


def quota_hard(tenant: Tenant, gpu_resources: Iterable[str],
               device_classes: Iterable[str] = ()) -> dict[str, str]:
    """The quota's hard limits: gpu_quota of each GPU resource (an extended resource is
    quota'd by its requests.* name only, Kubernetes' rule for extended resources) and of each
    DRA DeviceClass's devices, and what the entry sets of pods, cpu and memory."""
    hard = {f"requests.{r}": str(tenant.gpu_quota) for r in sorted(set(gpu_resources))}
    hard |= {DRA_QUOTA.format(c): str(tenant.gpu_quota) for c in sorted(set(device_classes))}
    if tenant.pods is not None:
        hard["pods"] = str(tenant.pods)
    if tenant.cpu:
        hard["requests.cpu"] = tenant.cpu
    if tenant.memory:
        hard["requests.memory"] = tenant.memory
    return hard


def manifest(tenant: Tenant, gpu_resources: Iterable[str], defaults: Mapping[str, str],
             pod_security: str, device_classes: Iterable[str] = ()) -> str:
    """The tenant's namespace, quota, limit defaults and edit binding, as a JSON stream
    (YAML documents; every value is data, never template text)."""
    ns = tenant.name
    default: dict[str, str] = {}
    if defaults.get("memory_limit"):
        default["memory"] = str(defaults["memory_limit"])
    container: dict[str, Any] = {"type": "Container",
                                 "defaultRequest": {"cpu": str(defaults["cpu_request"]),
                                                    "memory": str(defaults["memory_request"])}}
    if default:
        container["default"] = default
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": ns, "labels": {
             TENANT_LABEL: tenant.kind,
             "pod-security.kubernetes.io/enforce": pod_security,
             "pod-security.kubernetes.io/warn": pod_security}}},
        {"apiVersion": "v1", "kind": "ResourceQuota",
         "metadata": {"name": QUOTA, "namespace": ns},
         "spec": {"hard": quota_hard(tenant, gpu_resources, device_classes)}},
        {"apiVersion": "v1", "kind": "LimitRange",
         "metadata": {"name": LIMITS, "namespace": ns},
         "spec": {"limits": [container]}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": BINDING, "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "edit"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": m}
                      for m in tenant.members]},
    ]
    return "".join("---\n" + json.dumps(d, indent=2, sort_keys=True) + "\n" for d in docs)


def tenant_namespaces(managed: Iterable[str]) -> set[str]:
    """The tenant namespaces among the Cluster fact's managed object keys
    ("Kind/namespace/name"): those holding gpuk8s's quota."""
    out = set()
    for key in managed:
        kind, _, rest = key.partition("/")
        ns, _, name = rest.partition("/")
        if kind == "ResourceQuota" and name == QUOTA:
            out.add(ns)
    return out
