"""What plan, bootstrap and check refuse about an inventory as a whole (cluster_problems):
an even number of control planes, an endpoint mode the control planes cannot have. The
`check` command that prints them is gpuk8s.api.check."""

from __future__ import annotations

from gpuk8s.errors import InventoryError
from gpuk8s.inventory.model import Inventory


def cluster_problems(inv: Inventory) -> list[InventoryError]:
    """What plan and bootstrap refuse about the inventory as a whole: an even number of control
    planes (etcd quorum), and an endpoint mode the control planes cannot have."""
    out = []
    cps = inv.control_planes
    if len(cps) % 2 == 0 and cps:
        n = len(cps)
        out.append(InventoryError(
            f"{n} control planes ({', '.join(h.name for h in cps)}): every control plane runs "
            f"an etcd member, and etcd accepts writes only while a majority ({n // 2 + 1} of "
            f"{n}) is up, so {n} control planes survive as many failures as {n - 1} do "
            f"({(n - 1) // 2}) while adding one more machine that can fail",
            path=str(inv.path), fix=_odd_fix(inv, n)))
    if cps:
        first = cps[0].vars
        mode, endpoint = first.get("control_plane_endpoint_mode"), \
            first.get("control_plane_endpoint")
        if mode == "external" and not endpoint:
            out.append(InventoryError(
                "control_plane_endpoint_mode is external but control_plane_endpoint is empty",
                path=str(inv.path), fix='name the load balancer you run in front of the API '
                'servers: control_plane_endpoint: "k8s-api.lab:6443"'))
        if mode == "local_lb" and endpoint:
            out.append(InventoryError(
                f"control_plane_endpoint is {endpoint!r} but control_plane_endpoint_mode is "
                "local_lb, whose endpoint is each node's own load balancer (127.0.0.1:6443)",
                path=str(inv.path), fix="remove control_plane_endpoint, or set "
                "control_plane_endpoint_mode: external to use your load balancer"))
    return out


def _odd_fix(inv: Inventory, n: int) -> str:
    fix = f"use an odd number of control planes: {n - 1} or {n + 1} (the others can be workers)"
    etcd = inv.etcd_group
    if len(etcd) % 2 and set(etcd) != {h.name for h in inv.control_planes}:
        fix += (f". This inventory's etcd group ({', '.join(etcd)}) is where kubespray runs "
                "etcd apart from its control planes; gpuk8s runs one etcd member on each "
                f"control plane (kubeadm's stacked etcd): list {', '.join(etcd)} under "
                "control_plane to keep that etcd cluster's size")
    return fix
