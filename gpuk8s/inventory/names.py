"""Names of variables an inventory may carry that gpuk8s does not define: a near-miss of one of
its own (a typo, refused with "did you mean"), another tool's name for one of its settings
(refused with the exact rename), or another playbook's variable (ignored with a warning)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from gpuk8s.variables import VarProblem

#: other tools' settings that mean a gpuk8s variable: refused with the exact rename (a
#: shared inventory must not silently lose them), until they are mapped
OTHER_TOOLS_NAMES = {
    "kube_version": ("kubespray", "kubernetes_version", 'a minor version like "1.36"'),
    "kube_pods_subnet": ("kubespray", "pod_cidr", None),
    "kube_service_addresses": ("kubespray", "service_cidr", None),
    "kube_network_plugin": ("kubespray", "cni", "flannel or calico"),
    "container_manager": ("kubespray", "container_runtime", "containerd or docker"),
    "dns_domain": ("kubespray", "cluster_dns_domain", None),
    "kube_feature_gates": ("kubespray", "feature_gates", "a mapping like {Name: true}"),
    "kubelet_feature_gates": ("kubespray", "feature_gates", "a mapping like {Name: true}"),
    "kube_apiserver_feature_gates": ("kubespray", "feature_gates",
                                     "a mapping like {Name: true}"),
}



def near_miss(name: str, known: Iterable[str]) -> str | None:
    """A known name ``name`` is a typo of, or None.

    Tight on purpose: a proposal must share the first three characters, differ in length by at
    most three and be at least 85% similar. A loose match proposes variables of another meaning
    (kubespray's container_manager is not containerd_sandbox_image, DeepOps' slurm_password is
    not ansible_become_password)."""
    best: tuple[float, str] | None = None
    for k in known:
        if k[:3] != name[:3] or abs(len(k) - len(name)) > 3:
            continue
        ratio = difflib.SequenceMatcher(None, name, k).ratio()
        if ratio >= 0.85 and (best is None or ratio > best[0]):
            best = (ratio, k)
    return best[1] if best else None


def unknown_variable(name: str, specs: Iterable[str]) -> VarProblem | None:
    """The problem for a variable that no defaults file defines: a near-miss of a gpuk8s name
    (did you mean...), or another tool's name for a gpuk8s setting. None: a variable gpuk8s
    does not use (another playbook's), which the inventory may carry."""
    if name in OTHER_TOOLS_NAMES:
        tool, ours, shape = OTHER_TOOLS_NAMES[name]
        return VarProblem(name, f"{name} is {tool}'s setting; gpuk8s reads {ours}",
                          f"set {ours}" + (f" ({shape})" if shape else "") +
                          f" to the same value; gpuk8s does not translate {name} yet")
    best = near_miss(name, list(specs))
    if best:
        return VarProblem(name, f"unknown variable {name!r}; did you mean {best!r}?",
                          f"rename it to {best}")
    return None
