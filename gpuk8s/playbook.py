"""The bootstrap playbook: ordered phases, each a host selection and its roles (like
kubespray's cluster.yml). Phases are separated by barriers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuk8s.errors import InventoryError


@dataclass(frozen=True)
class Phase:
    name: str
    #: "all" | "first_control_plane" | "other_control_planes" | "workers"
    #: | "package_cache" (the apt cache host, when package_cache is on)
    hosts: str
    roles: tuple[str, ...]
    title: str
    #: hand-offs this phase needs before it applies (made by the runner, kept in memory):
    #: "join_token", a fresh short-lived kubeadm token from the first control plane;
    #: "certificate_key", a fresh key with which the first control plane uploads the shared
    #: certificates (kubeadm-certs, deleted by kubeadm after two hours)
    needs: tuple[str, ...] = ()
    #: hand-offs this phase makes once applied: "admin_conf", the cluster's admin kubeconfig
    #: saved (checked, 0600) beside the inventory
    provides: tuple[str, ...] = ()
    #: apply to this many hosts at a time, stopping at the first batch that fails (a rolling
    #: restart); 0: every host at once
    serial: int = 0
    #: drain a joined node before changing it and uncordon it after (unless it was cordoned
    #: before the run); its timeout is the host variable of that name
    drain_timeout_var: str = ""
    #: with drain_timeout_var: also stop the GPU DaemonSets' pods on the node (device plugin,
    #: DRA kubelet plugin, DCGM exporter) while the phase changes it, and bring them back after
    pause_gpu_clients: bool = False
    #: with drain_timeout_var: before a changed node is uncordoned, wait (that timeout) for it
    #: to be Ready with its GPUs allocatable again (a kubelet restarted on a new release)
    wait_ready: bool = False


PREFLIGHT = "preflight"

PHASES: tuple[Phase, ...] = (
    # before the node phase: the cache answers before any node's apt is pointed at it
    Phase("package-cache", "package_cache", ("package_cache",),
          "apt cache: apt-cacher-ng on the cache host, used by every node"),
    Phase("node", "all", ("base", "container_runtime", "kubernetes", "apiserver_lb",
                          "nvidia_driver", "cuda", "nvidia_container_toolkit", "gpu_health"),
          "node stack: base, containerd, kubeadm/kubelet/kubectl, API endpoint, NVIDIA driver, "
          "CUDA, toolkit, GPU health watch"),
    # after the node phase installed the kernel headers and the driver: hold them together
    Phase("gpu-lock", "all", ("gpu_node_lock",),
          "GPU nodes: the running kernel and the NVIDIA driver held together, "
          "unattended-upgrades kept away from them"),
    Phase("control-plane", "first_control_plane", ("control_plane", "cni"),
          "control plane: kubeadm init, admin kubeconfig, pod network",
          provides=("admin_conf",)),
    # one at a time: each new etcd member must be healthy before the next changes the quorum
    Phase("control-plane-join", "other_control_planes", ("join",),
          "control planes: kubeadm join --control-plane, one at a time, each waited for",
          needs=("join_token", "certificate_key"), serial=1),
    Phase("join", "workers", ("join",), "join: workers into the cluster",
          needs=("join_token",)),
    # after the control plane phase stored the gates in kube-system/kubelet-config
    Phase("kubelets", "all", ("kubelet",),
          "kubelets: the inventory's feature gates, one node at a time", serial=1),
    # one node at a time, drained and with the GPU DaemonSets paused: the driver refuses a MIG
    # mode change while any process (workload, device plugin, DCGM) has the GPU open
    Phase("gpu-partition", "all", ("mig",),
          "MIG: GPUs split as gpu_sharing asks, one drained node at a time", serial=1,
          drain_timeout_var="mig_drain_timeout", pause_gpu_clients=True),
    Phase("cluster", "first_control_plane", ("gpu_cluster", "monitoring"),
          "GPUs in the cluster: labels, RuntimeClass, device plugin, allocatable; monitoring"),
    # after the cluster phase: the quotas name the GPU resources the nodes now offer
    Phase("tenancy", "first_control_plane", ("tenancy",),
          "the lab's users and groups: namespaces, GPU quotas, default requests, edit role"),
)

#: ``invoke upgrade --kubernetes``: kubeadm's order (the first control plane with `kubeadm
#: upgrade apply`, the other control planes one at a time, then the workers in batches), each
#: node drained, its container runtime brought to the new release's needs (the pause image
#: kubeadm expects for the minor; containerd 2.x from 1.36) and its Kubernetes packages moved
#: with the same repo and apt ops bootstrap uses, then waited for before it is uncordoned;
#: last, the control plane role writes its kubeadm config again (kubernetesVersion follows
#: the installed kubeadm). day2.kubernetes sets the worker batch size.
def _rolling(name: str, hosts: str, title: str) -> Phase:
    return Phase(name, hosts, ("container_runtime", "kubernetes_upgrade"), title, serial=1,
                 drain_timeout_var="upgrade_drain_timeout", wait_ready=True)


UPGRADE_PHASES: tuple[Phase, ...] = (
    _rolling("upgrade-first-control-plane", "first_control_plane",
             "the first control plane: containerd, kubeadm, `kubeadm upgrade apply`, kubelet"),
    _rolling("upgrade-control-planes", "other_control_planes",
             "the other control planes, one at a time: containerd, kubeadm, `kubeadm upgrade "
             "node`, kubelet"),
    _rolling("upgrade-workers", "workers",
             "workers, a batch at a time: containerd, kubeadm, `kubeadm upgrade node`, kubelet"),
    Phase("upgrade-config", "first_control_plane", ("control_plane",),
          "control plane: gpuk8s's kubeadm config at the cluster's new release"),
)

#: every role whose facts a run gathers, in order
ALL_ROLES: tuple[str, ...] = tuple(dict.fromkeys(
    (PREFLIGHT, *(r for p in PHASES + UPGRADE_PHASES for r in p.roles))))


def package_cache_host(inventory: Any) -> str | None:
    """The host running the cluster's apt cache (package_cache_host, or the first control
    plane), or None when package_cache is off. package_cache is cluster-wide."""
    cps = inventory.control_planes
    if not cps or not cps[0].vars.get("package_cache"):
        return None
    name = str(cps[0].vars.get("package_cache_host") or cps[0].name)
    if name not in inventory.hosts:
        raise InventoryError(f"package_cache_host {name!r} is not a host of the inventory",
                             path=str(inventory.path),
                             fix=f"name one of: {', '.join(inventory.hosts)}, or \"\" for the "
                             "first control plane")
    return name
