# LAB STAND-IN: not the real Kubernetes. Test infrastructure for gpuk8s; never shipped to users.
"""The API resources the stand-in API server serves (a subset of the real discovery documents)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Resource:
    group: str  # "" for core
    version: str
    kind: str
    plural: str
    namespaced: bool
    short: tuple[str, ...] = field(default_factory=tuple)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """'<plural>.<group>' as in NotFound messages ('nodes', 'daemonsets.apps')."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def singular(self) -> str:
        return self.kind.lower()

    def base_path(self, namespace: str | None = None) -> str:
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            return f"{prefix}/namespaces/{namespace}/{self.plural}"
        return f"{prefix}/{self.plural}"


def _r(gv: str, kind: str, plural: str, ns: bool, *short: str) -> Resource:
    group, _, version = gv.rpartition("/")
    return Resource(group, version, kind, plural, ns, tuple(short))


BUILTIN: list[Resource] = [
    _r("v1", "Namespace", "namespaces", False, "ns"),
    _r("v1", "Node", "nodes", False, "no"),
    _r("v1", "Pod", "pods", True, "po"),
    _r("v1", "Service", "services", True, "svc"),
    _r("v1", "Endpoints", "endpoints", True, "ep"),
    _r("v1", "ConfigMap", "configmaps", True, "cm"),
    _r("v1", "Secret", "secrets", True),
    _r("v1", "ServiceAccount", "serviceaccounts", True, "sa"),
    _r("v1", "Event", "events", True, "ev"),
    _r("v1", "PersistentVolume", "persistentvolumes", False, "pv"),
    _r("v1", "PersistentVolumeClaim", "persistentvolumeclaims", True, "pvc"),
    _r("v1", "LimitRange", "limitranges", True, "limits"),
    _r("v1", "ResourceQuota", "resourcequotas", True, "quota"),
    _r("apps/v1", "Deployment", "deployments", True, "deploy"),
    _r("apps/v1", "DaemonSet", "daemonsets", True, "ds"),
    _r("apps/v1", "ReplicaSet", "replicasets", True, "rs"),
    _r("apps/v1", "StatefulSet", "statefulsets", True, "sts"),
    _r("batch/v1", "Job", "jobs", True),
    _r("batch/v1", "CronJob", "cronjobs", True, "cj"),
    _r("node.k8s.io/v1", "RuntimeClass", "runtimeclasses", False),
    _r("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets", True, "pdb"),
    _r("scheduling.k8s.io/v1", "PriorityClass", "priorityclasses", False, "pc"),
    _r("storage.k8s.io/v1", "StorageClass", "storageclasses", False, "sc"),
    _r("storage.k8s.io/v1", "CSIDriver", "csidrivers", False),
    _r("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", False),
    _r("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings", False),
    _r("rbac.authorization.k8s.io/v1", "Role", "roles", True),
    _r("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", True),
    _r("coordination.k8s.io/v1", "Lease", "leases", True),
    _r("certificates.k8s.io/v1", "CertificateSigningRequest", "certificatesigningrequests",
       False, "csr"),
    _r("apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions",
       False, "crd", "crds"),
    _r("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies", True, "netpol"),
    _r("networking.k8s.io/v1", "Ingress", "ingresses", True, "ing"),
    _r("resource.k8s.io/v1", "DeviceClass", "deviceclasses", False),
    _r("resource.k8s.io/v1", "ResourceClaim", "resourceclaims", True),
    _r("resource.k8s.io/v1", "ResourceClaimTemplate", "resourceclaimtemplates", True),
    _r("resource.k8s.io/v1", "ResourceSlice", "resourceslices", False),
    _r("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration",
       "validatingwebhookconfigurations", False),
    _r("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration",
       "mutatingwebhookconfigurations", False),
]


class Registry:
    """Resource lookup by kind, plural, singular or short name; CRDs can be added at runtime."""

    def __init__(self, resources: list[Resource] | None = None) -> None:
        self.resources: list[Resource] = list(resources or BUILTIN)

    def add(self, res: Resource) -> None:
        self.resources = [r for r in self.resources
                          if not (r.group == res.group and r.plural == res.plural
                                  and r.version == res.version)]
        self.resources.append(res)

    def by_kind(self, api_version: str, kind: str) -> Resource | None:
        for r in self.resources:
            if r.api_version == api_version and r.kind == kind:
                return r
        return None

    def by_path(self, group: str, version: str, plural: str) -> Resource | None:
        for r in self.resources:
            if r.group == group and r.version == version and r.plural == plural:
                return r
        return None

    def lookup(self, name: str) -> Resource | None:
        """kubectl-style resource argument: 'nodes', 'node', 'no', 'daemonsets.apps', 'ds'."""
        name = name.lower()
        res, _, group = name.partition(".")
        for r in self.resources:
            if group and r.group != group and not r.group.startswith(group):
                continue
            if res in (r.plural, r.singular, *r.short):
                return r
        return None

    def groups(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for r in self.resources:
            versions = out.setdefault(r.group, [])
            if r.version not in versions:
                versions.append(r.version)
        return out
