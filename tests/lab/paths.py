"""Fixed names, addresses and directories of the lab (see CONTRACT.md)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

#: the checkout: what tests and helpers at any depth under tests/lab/ read files from and run
#: commands in (never parents[3+] of a test module: tests/unit/test_self_contained.py)
REPO_ROOT = Path(__file__).resolve().parents[2]
BRIDGE = "gk8s0"
HOST_IP = "10.88.0.1"
SUBNET_PREFIX = "10.88.0."
PREFIX_LEN = 24
NETNS_PREFIX = "gk8s-"
VETH_PREFIX = "gk8v"  # host side: gk8v<last octet>; node side: eth0
PROXY_PORT = 3142
#: the lab's OCI registry (tests/lab/registry.py), every registry's mirror in the lab inventory
REGISTRY_PORT = 5000
REGISTRY_URL = f"http://{HOST_IP}:{REGISTRY_PORT}"
#: the registries the cluster's and the workloads' images come from (`invoke images`)
LAB_REGISTRIES = ("docker.io", "registry.k8s.io", "nvcr.io", "ghcr.io", "quay.io")


def registry_mirrors(url: str = REGISTRY_URL) -> dict[str, list[str]]:
    """registry_mirrors sending every registry's pulls to one lab registry."""
    return {registry: [url] for registry in LAB_REGISTRIES}
REPO_PORT = 8081
PROXY_URL = f"http://{HOST_IP}:{PROXY_PORT}"
REPO_URL = f"http://{HOST_IP}:{REPO_PORT}"
IPTABLES_COMMENT = "gk8s-lab"
#: the lab repos' signing key (tests/lab/keys/, LAB ONLY), pinned by the lab inventory
LAB_KEY_FINGERPRINT = "4DB64E86A138065762E9BAA291D795CA270F06CD"


def key_pins() -> dict[str, str]:
    """The inventory variables that pin every lab repo's key to the lab key."""
    return {name: LAB_KEY_FINGERPRINT for name in (
        "kubernetes_repo_key_fingerprint", "nvidia_cuda_repo_key_fingerprint",
        "nvidia_container_toolkit_repo_key_fingerprint", "docker_repo_key_fingerprint")}


def state_dir() -> Path:
    return Path(os.environ.get("GPUK8S_LAB_STATE", "/var/lib/gpuk8s-lab"))


def shared_dir() -> Path:
    """The lab's shared folder, bind-mounted into every node at NODE_SHARED_DIR: where pods
    of an NFS persistent volume keep their files (this host has neither nfsd nor an NFS
    client). Emptied when a snapshot is restored."""
    return state_dir() / "shared"


#: where every node sees shared_dir() (the kubelet stand-in's LAB_NFS_ROOT)
NODE_SHARED_DIR = "/var/lib/gpuk8s-lab/nfs"


def cache_dir() -> Path:
    return Path(os.environ.get("GPUK8S_LAB_CACHE", "/var/cache/gpuk8s-lab"))


def node_ip(index: int) -> str:
    """IP of node ``index`` (1-based, spec order)."""
    if not 1 <= index <= 240:
        raise ValueError(f"node index {index} out of range 1..240")
    return f"{SUBNET_PREFIX}{10 + index}"


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    check: bool = True,
    capture: bool = True,
    input: str | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command; raise with its stderr when ``check`` and it fails."""
    args = [str(a) for a in argv]
    proc = subprocess.run(
        args,
        check=False,
        text=True,
        input=input,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        err = (proc.stderr or "").strip()
        raise LabError(f"command failed ({proc.returncode}): {' '.join(args)}\n{err}")
    return proc


class LabError(RuntimeError):
    """Raised when the lab cannot do what was asked."""
