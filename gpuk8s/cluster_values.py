"""The run-wide cluster values every role reads (HostContext.cluster), all derived here: from
the inventory alone, what ``gpuk8s check`` reads too (inventory_cluster: the API endpoint and
its mode, the control planes, the advertise address; package_cache_url), and with the facts
once gathered (cluster_values: each node's name, address and GPUs; mark_joined: which hosts
have joined a cluster). What one phase makes for another at run time (the join command, the
certificate key, admin.conf) is a hand-off: gpuk8s/handoffs.py."""

from __future__ import annotations

from typing import Any

from gpuk8s.facts import HostFacts
from gpuk8s.facts.system import Files, PciDevices, System
from gpuk8s.gpusharing import sharing_of
from gpuk8s.inventory.model import Inventory
from gpuk8s.lockfile import lock_path, read_apt_pins
from gpuk8s.playbook import package_cache_host
from gpuk8s.session import Session, role_vars

#: the endpoint of control_plane_endpoint_mode local_lb: each node's own HAProxy
LOCAL_LB_ENDPOINT = "127.0.0.1:6443"


def endpoint_of(inventory: Inventory) -> tuple[str, str]:
    """(mode, host:port) of the cluster's API endpoint: "external" (control_plane_endpoint),
    "local_lb" (127.0.0.1:6443 on every node) or "direct" (the first control plane's
    address:6443, with a single control plane); mode "auto" picks one of them."""
    cps = [h for h in inventory.control_planes if not h.absent] or inventory.control_planes
    first = cps[0]
    mode, given = first.vars["control_plane_endpoint_mode"], first.vars["control_plane_endpoint"]
    if mode == "auto":
        mode = "external" if given else "local_lb" if len(cps) > 1 else "direct"
    if mode == "local_lb":
        return mode, LOCAL_LB_ENDPOINT
    if mode == "external":
        return mode, given
    address = f"[{first.address}]" if ":" in first.address else first.address
    return mode, f"{address}:6443"


def inventory_cluster(inventory: Inventory, first_cp: str | None = None) -> dict[str, Any]:
    """The cluster values that need only the inventory: the endpoint and its mode, the
    control planes, and the first control plane's address (the API server advertises it).
    ``first_cp``: the control plane that speaks for the cluster (default the first listed)."""
    mode, endpoint = endpoint_of(inventory)
    cp = inventory.hosts[first_cp] if first_cp else inventory.control_planes[0]
    return {"endpoint": endpoint, "endpoint_mode": mode,
            "control_planes": [{"host": h.name, "address": h.address}
                               for h in inventory.control_planes if not h.absent],
            "advertise_address": cp.address}


def package_cache_url(inventory: Any) -> str:
    """http://<cache host address>:3142, or "" when package_cache is off."""
    name = package_cache_host(inventory)
    if name is None:
        return ""
    address = inventory.hosts[name].address
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:3142"


def cluster_values(session: Session) -> None:
    """Node names, addresses and GPU counts of the hosts in this run; the API endpoint."""
    cp = session.host(session.first_cp)
    nodes = {}
    for name in session.facts:
        facts = session.facts[name]
        gpus = [d for d in facts[PciDevices()] if d.is_gpu]
        host = session.host(name)
        values = role_vars(host)
        sharing = dict(values.get("gpu_sharing") or {})
        nodes[name] = {"name": facts[System()].hostname.lower(),
                       "address": host.address, "gpus": len(gpus),
                       # pods run there (a worker, or a control plane without the taint)
                       "schedulable": host.schedulable,
                       "sharing": sharing,
                       "model": gpus[0].model if gpus else "",
                       # the nvidia.com/gpu its device plugin offers: none on a tainted control
                       # plane (no device plugin there), with MIG (other resource names) or
                       # DRA (ResourceSlices); its GPUs times the time-slicing replicas
                       "allocatable_gpus": 0 if not host.schedulable
                       or values.get("gpu_allocation") == "dra"
                       else sharing_of(sharing).offered(len(gpus))}
    session.cluster.update(**inventory_cluster(session.inventory, cp.name),
                           node_name=nodes.get(cp.name, {}).get("name", cp.name), nodes=nodes,
                           package_cache_url=package_cache_url(session.inventory))


def mark_joined(session: Session) -> None:
    """Whether each host in scope has joined a cluster (its kubelet.conf exists), for
    preflight, as its facts show."""
    for name in session.scope:
        session.cluster.setdefault("joined", {})[name] = _file_exists(
            session.facts[name], "/etc/kubernetes/kubelet.conf")


def _file_exists(facts: HostFacts, path: str) -> bool:
    """Whether any Files fact gathered for the host saw ``path`` (whichever role asked)."""
    for fact, value in facts.items():
        if isinstance(fact, Files) and path in value:
            return bool(value[path].exists)
    return False


def use_lock(session: Session) -> None:
    """The inventory's lock (`invoke lock`), when one lies beside it: the roles install the
    versions it pins (HostContext.apt) and the plan names what differs on a node. Only runs
    that converge read it (runner.converge): `invoke lock` itself plans without it, so a lock
    older than the inventory never stands in the way of the new one."""
    path = lock_path(session.inventory.path)
    if path.exists():
        session.cluster["apt_lock"] = {"path": str(path), "releases": read_apt_pins(path)}
        session.reporter.print(f"lock: installing the versions {path.name} pins")
