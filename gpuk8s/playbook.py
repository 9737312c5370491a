"""The bootstrap playbook: ordered phases, each a host selection and its roles (like
kubespray's cluster.yml). Phases are separated by barriers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Phase:
    name: str
    #: "all" | "first_control_plane" | "joiners" (workers and extra control planes)
    hosts: str
    roles: tuple[str, ...]
    title: str


PREFLIGHT = "preflight"

PHASES: tuple[Phase, ...] = (
    Phase("node", "all", ("base", "container_runtime", "kubernetes", "nvidia_driver", "cuda",
                          "nvidia_container_toolkit"),
          "node stack: base, containerd, kubeadm/kubelet/kubectl, NVIDIA driver, CUDA, toolkit"),
    Phase("control-plane", "first_control_plane", ("control_plane", "cni"),
          "control plane: kubeadm init, admin kubeconfig, pod network"),
    Phase("join", "joiners", ("join",), "join: workers into the cluster"),
    Phase("cluster", "first_control_plane", ("gpu_cluster",),
          "GPUs in the cluster: labels, RuntimeClass, device plugin, allocatable"),
)

#: every role whose facts a run gathers, in order
ALL_ROLES: tuple[str, ...] = (PREFLIGHT, *(r for p in PHASES for r in p.roles))
