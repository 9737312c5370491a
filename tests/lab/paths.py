"""Fixed names, addresses and directories of the lab (see CONTRACT.md)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

#: the checkout: what tests and helpers at any depth under tests/lab/ read files from and run
#: commands in (never parents[3+] of a test module: tests/unit/test_self_contained.py)
REPO_ROOT = Path(__file__).resolve().parents[2]


def _instance() -> int:
    raw = os.environ.get("GPUK8S_LAB_INSTANCE", "0")
    if raw not in ("0", "1"):
        raise SystemExit(f"GPUK8S_LAB_INSTANCE={raw!r}: the lab has instances 0 (the default) "
                         "and 1 (a second lab beside it, for the test suite); set 0 or 1")
    return int(raw)


#: which of the two labs this process drives (GPUK8S_LAB_INSTANCE): both share the bridge,
#: the host's address and its services (apt-cacher-ng, the repos, the registry, the caches);
#: each has its own nodes (netns, cgroups, addresses), state dir, snapshots and lock
INSTANCE = _instance()
INSTANCES = (0, 1)
BRIDGE = "gk8s0"
#: the bridge's own MAC (locally administered). Without one, Linux gives a bridge the lowest
#: MAC of its ports and changes it whenever a port comes or goes: each restore of one lab
#: instance (its veths deleted and made again) then moved the host address 10.88.0.1 to
#: another MAC under the other instance's nodes, whose ARP entries went stale; their SSH and
#: HTTP to the host stalled for up to two minutes (the CI run of a67c09d: every lab-1 node's
#: registry check timed out while lab 0 went down). A MAC set by hand stays.
BRIDGE_MAC = "02:67:6b:38:73:01"
HOST_IP = "10.88.0.1"
SUBNET_PREFIX = "10.88.0."
PREFIX_LEN = 24
#: node addresses: instance 0 from .11 (up to 240 nodes when alone), instance 1 from .131
#: (up to 120 nodes; instance 0 stays under 120 beside it)
IP_OFFSET = (10, 130)
NETNS_PREFIX = ("gk8s-", "gk8s1-")[INSTANCE]
VETH_PREFIX = "gk8v"  # host side: gk8v<last octet>; node side: eth0
#: the cgroup of each node's supervisor: <prefix><node name>
CGROUP_PREFIX = ("gpuk8s-lab-", "gpuk8s-lab1-")[INSTANCE]
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


def state_dir(instance: int | None = None) -> Path:
    """This instance's state (nodes, snapshots, inventory); another instance's by number."""
    if instance is None or instance == INSTANCE:
        env = os.environ.get("GPUK8S_LAB_STATE")
        if env:
            return Path(env)
        instance = INSTANCE
    return Path("/var/lib/gpuk8s-lab" + ("" if instance == 0 else f"-{instance}"))


def services_dir() -> Path:
    """Run files of the host's services both instances share (apt-cacher-ng, the repos'
    server, the registry): outside every state dir, which `down` clears; under a state dir
    set by GPUK8S_LAB_STATE (a test's own), so that its services are its own too."""
    if os.environ.get("GPUK8S_LAB_SERVICES"):
        return Path(os.environ["GPUK8S_LAB_SERVICES"])
    if os.environ.get("GPUK8S_LAB_STATE"):
        return Path(os.environ["GPUK8S_LAB_STATE"]) / "services"
    return Path("/run/gpuk8s-lab-services")


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
    top = 250 - IP_OFFSET[INSTANCE]
    if not 1 <= index <= top:
        raise ValueError(f"node index {index} out of range 1..{top} (lab instance {INSTANCE})")
    if IP_OFFSET[INSTANCE] + index > IP_OFFSET[1] and INSTANCE == 0 and others_up():
        raise ValueError(f"node index {index}: lab instance 1 is up and has the addresses "
                         f"from {SUBNET_PREFIX}{IP_OFFSET[1] + 1}; take it down first "
                         "(GPUK8S_LAB_INSTANCE=1 python -m tests.lab down)")
    return f"{SUBNET_PREFIX}{IP_OFFSET[INSTANCE] + index}"


def own_veth_octet(last: int, other_in_use: bool = True) -> bool:
    """Whether a node address ending in ``last`` (a veth gk8v<last>) is this instance's:
    instance 1 has .131 and up; instance 0 the rest, and those too when instance 1 is not in
    use (``other_in_use``: lock.others_in_use(), which also counts a session between restores,
    whose nodes are down while their veths are made)."""
    if INSTANCE == 1:
        return IP_OFFSET[1] < last <= 250
    return IP_OFFSET[0] < last <= IP_OFFSET[1] or (IP_OFFSET[1] < last <= 250
                                                   and not other_in_use)


def others_up() -> bool:
    """Whether another instance of the lab has a node running (its supervisors' pid files)."""
    for other in INSTANCES:
        if other == INSTANCE:
            continue
        for pidfile in (state_dir(other) / "nodes").glob("*/supervisor.pid"):
            try:
                pid = int(pidfile.read_text().split()[0])
                os.kill(pid, 0)
            except (OSError, ValueError, IndexError):
                continue
            return True
    return False


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
